//! Names that appear in the log. Each enum is `repr(u8)` so an `Event` stays small.
//!
//! Each enum (de)serializes as its name in the log and rejects names it does
//! not know. The reader's records hold them as [`Named`] instead, which keeps
//! a name this build does not know (a newer shim's API, say) as a string, so
//! that one unfamiliar name never makes a whole log unreadable.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The enums of this module: a fixed set of names.
pub trait NamedEnum: Copy + Sized + 'static {
    fn as_str(self) -> &'static str;
    fn from_name(s: &str) -> Option<Self>;
}

/// A name read from a log: one this build knows, or any other string, kept
/// as written. Serializes back to the same string.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Named<T> {
    Known(T),
    Unknown(String),
}

impl<T: NamedEnum> Named<T> {
    /// The known value, `None` for an unknown name.
    pub fn known(&self) -> Option<T> {
        match self {
            Named::Known(t) => Some(*t),
            Named::Unknown(_) => None,
        }
    }

    /// The name as written in the log.
    pub fn as_str(&self) -> &str {
        match self {
            Named::Known(t) => t.as_str(),
            Named::Unknown(s) => s,
        }
    }

    /// Parses a name, keeping an unknown one as a string.
    pub fn from_name(s: &str) -> Named<T> {
        T::from_name(s).map_or_else(|| Named::Unknown(s.to_string()), Named::Known)
    }
}

impl<T> From<T> for Named<T> {
    fn from(t: T) -> Self {
        Named::Known(t)
    }
}

impl<T: NamedEnum + PartialEq> PartialEq<T> for Named<T> {
    fn eq(&self, other: &T) -> bool {
        self.known() == Some(*other)
    }
}

impl<T: NamedEnum> std::fmt::Display for Named<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<T: NamedEnum> Serialize for Named<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de, T: NamedEnum> Deserialize<'de> for Named<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(Named::from_name(&s))
    }
}

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name { $($variant),+ }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
            pub fn from_name(s: &str) -> Option<$name> {
                match s { $($text => Some($name::$variant),)+ _ => None }
            }
        }
        impl NamedEnum for $name {
            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }
            fn from_name(s: &str) -> Option<Self> {
                $name::from_name(s)
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
        /// By its name in the log; an unknown name is an error (see [`Named`] for a tolerant field).
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                $name::from_name(&s).ok_or_else(|| {
                    serde::de::Error::custom(format!("unknown {} {:?}", stringify!($name), s))
                })
            }
        }
    };
}

named_enum!(
    /// What happened.
    EventKind {
        Start => "start",
        Alloc => "alloc",
        Free => "free",
        AllocFailed => "alloc_failed",
        InvalidFree => "invalid_free",
        Checkpoint => "checkpoint",
        Map => "map",
        Unmap => "unmap",
        Oom => "oom",
        PhaseBegin => "phase_begin",
        PhaseEnd => "phase_end",
        Reserve => "reserve",
        Release => "release",
    }
);

named_enum!(
    /// What kind of memory an allocation is.
    MemKind {
        Device => "device",
        Managed => "managed",
        Pitched => "pitched",
        Async => "async",
        Host => "host",
        Vmm => "vmm",
    }
);

impl EventKind {
    /// Whether the event names the API entry point that made it: every kind
    /// but the first line and the pool's own traffic with CUDA.
    pub const fn has_api(self) -> bool {
        !matches!(self, EventKind::Start | EventKind::Reserve | EventKind::Release)
    }

    /// The API an event of this kind names when its line leaves `api` out
    /// (version 5): the runtime's plain allocation and free, the most
    /// common lines of most logs.
    pub const fn default_api(self) -> Option<Api> {
        match self {
            EventKind::Alloc => Some(Api::CudaMalloc),
            EventKind::Free => Some(Api::CudaFree),
            _ => None,
        }
    }

    /// Whether the event says which kind of memory it is about (`kind`).
    pub const fn has_mem_kind(self) -> bool {
        matches!(
            self,
            EventKind::Alloc
                | EventKind::Free
                | EventKind::Map
                | EventKind::Unmap
                | EventKind::AllocFailed
                | EventKind::Oom
        )
    }

    /// Whether the event says which device it is about (`device`).
    pub const fn has_device(self) -> bool {
        !matches!(self, EventKind::Start)
    }
}

impl MemKind {
    /// Pinned host memory is tracked apart from device memory.
    pub const fn is_device(self) -> bool {
        !matches!(self, MemKind::Host)
    }
}

named_enum!(
    /// The API entry point that made the call, by its exact exported name.
    Api {
        None => "",
        CudaMalloc => "cudaMalloc",
        CudaFree => "cudaFree",
        CudaMallocAsync => "cudaMallocAsync",
        CudaMallocAsyncPtsz => "cudaMallocAsync_ptsz",
        CudaFreeAsync => "cudaFreeAsync",
        CudaFreeAsyncPtsz => "cudaFreeAsync_ptsz",
        CudaMallocFromPoolAsync => "cudaMallocFromPoolAsync",
        CudaMallocFromPoolAsyncPtsz => "cudaMallocFromPoolAsync_ptsz",
        CudaMallocManaged => "cudaMallocManaged",
        CudaMallocPitch => "cudaMallocPitch",
        CudaMalloc3D => "cudaMalloc3D",
        CudaMallocHost => "cudaMallocHost",
        CudaHostAlloc => "cudaHostAlloc",
        CudaFreeHost => "cudaFreeHost",
        CudaDeviceReset => "cudaDeviceReset",
        CuMemAlloc => "cuMemAlloc_v2",
        CuMemFree => "cuMemFree_v2",
        CuMemAllocPitch => "cuMemAllocPitch_v2",
        CuMemAllocManaged => "cuMemAllocManaged",
        CuMemAllocAsync => "cuMemAllocAsync",
        CuMemAllocAsyncPtsz => "cuMemAllocAsync_ptsz",
        CuMemFreeAsync => "cuMemFreeAsync",
        CuMemFreeAsyncPtsz => "cuMemFreeAsync_ptsz",
        CuMemAllocFromPoolAsync => "cuMemAllocFromPoolAsync",
        CuMemAllocFromPoolAsyncPtsz => "cuMemAllocFromPoolAsync_ptsz",
        CuMemAllocHost => "cuMemAllocHost_v2",
        CuMemHostAlloc => "cuMemHostAlloc",
        CuMemFreeHost => "cuMemFreeHost",
        CuMemCreate => "cuMemCreate",
        CuMemRelease => "cuMemRelease",
        CuMemMap => "cuMemMap",
        CuMemUnmap => "cuMemUnmap",
        CuCtxDestroy => "cuCtxDestroy_v2",
        CuDevicePrimaryCtxReset => "cuDevicePrimaryCtxReset_v2",
        Exit => "exit",
        CupoolMark => "cupool_mark",
        CupoolPhaseBegin => "cupool_phase_begin",
        CupoolPhaseEnd => "cupool_phase_end",
        NvtxRangePushA => "nvtxRangePushA",
        NvtxRangePushW => "nvtxRangePushW",
        NvtxRangePushEx => "nvtxRangePushEx",
        NvtxRangePop => "nvtxRangePop",
        NvtxRangeStartA => "nvtxRangeStartA",
        NvtxRangeStartW => "nvtxRangeStartW",
        NvtxRangeStartEx => "nvtxRangeStartEx",
        NvtxRangeEnd => "nvtxRangeEnd",
        NvtxDomainRangePushEx => "nvtxDomainRangePushEx",
        NvtxDomainRangePop => "nvtxDomainRangePop",
        NvtxDomainRangeStartEx => "nvtxDomainRangeStartEx",
        NvtxDomainRangeEnd => "nvtxDomainRangeEnd",
    }
);
