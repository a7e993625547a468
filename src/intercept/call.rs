//! What an allocating call asks for, what the real call did, and the record
//! the observers keep of an allocation.

use crate::cuda::{Status, SUCCESS};
use crate::observe::{self, Allocation, Pooled};
use crate::runtime::clock;
use cupool_core::log::{Api, MemKind};

/// An allocating call: the entry point, the kind of memory it makes, the
/// bytes asked for, its stream (stream-ordered calls) and its device when the
/// call names one (VMM); else the current context's device is asked.
#[derive(Clone, Copy)]
pub struct AllocCall {
    pub api: Api,
    pub kind: MemKind,
    pub request: u64,
    pub stream: u64,
    pub device: Option<i32>,
}

impl AllocCall {
    pub const fn new(api: Api, kind: MemKind, request: u64) -> AllocCall {
        AllocCall { api, kind, request, stream: 0, device: None }
    }

    pub const fn on_stream(self, stream: u64) -> AllocCall {
        AllocCall { stream, ..self }
    }

    pub const fn on_device(self, device: Option<i32>) -> AllocCall {
        AllocCall { device, ..self }
    }
}

/// What the real call did: (CUDA result, pointer or handle, bytes occupied).
pub type Outcome = (Status, u64, u64);

/// Reads the pointer a successful allocation wrote to its out-parameter.
///
/// # Safety
/// `out` is null or valid for reads.
#[inline]
pub unsafe fn out_ptr<T: Copy + Into<u64>>(out: *const T, result: Status) -> u64 {
    if result == SUCCESS && !out.is_null() {
        (*out).into()
    } else {
        0
    }
}

/// Is `api` a runtime call (which keeps a last error and may start a context)?
#[inline]
pub fn is_runtime(api: Api) -> bool {
    // Read from a table made at compile time: the hot path asks it per call.
    const RUNTIME: [bool; 256] = {
        let mut table = [false; 256];
        let mut i = 0;
        while i < Api::ALL.len() {
            let name = Api::ALL[i].as_str().as_bytes();
            table[Api::ALL[i] as usize] =
                name.len() >= 4 && name[0] == b'c' && name[1] == b'u' && name[2] == b'd' && name[3] == b'a';
            i += 1;
        }
        table
    };
    RUNTIME[api as usize]
}

/// The record the observers keep of an allocation of `size` bytes by `call`
/// in context `ctx` on `device`; `pooled`: the pool block serving it.
pub fn allocation_record(call: AllocCall, ctx: u64, device: i32, size: u64, pooled: Option<Pooled>) -> Allocation {
    Allocation {
        size,
        t_ns: clock::now_coarse_ns(),
        ctx,
        device,
        kind: call.kind,
        api: call.api,
        tid: crate::runtime::guard::tid(),
        stream: call.stream,
        pooled,
        stack: observe::sites::capture(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_calls_are_the_apis_named_cuda() {
        for &api in Api::ALL {
            assert_eq!(is_runtime(api), api.as_str().starts_with("cuda"), "{api}");
        }
        assert!(is_runtime(Api::CudaMalloc) && !is_runtime(Api::CuMemAlloc));
    }
}
