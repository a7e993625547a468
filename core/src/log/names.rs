//! Names that appear in the log. Each enum is `repr(u8)` so an `Event` stays small.

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
    }
);
