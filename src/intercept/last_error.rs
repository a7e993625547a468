//! A runtime call that cupool answers itself with an error leaves that error
//! as the thread's last one (`cudaGetLastError`), as the runtime would have:
//! programs check it after a sequence of calls, and a pooled `cudaMalloc`
//! refused without it would read as a success. The runtime has no setter,
//! so a real call that fails with the same code, and does nothing else,
//! leaves it. (A statically linked runtime reaches cupool only through the
//! driver and sets its last error from the driver's answer itself.)

use crate::cuda::{Status, INVALID_VALUE, OUT_OF_MEMORY, SUCCESS};
use crate::real;
use cupool_core::log::Api;

/// What cupool answers the runtime call `api`; made the thread's last error.
pub fn runtime_error(api: Api, code: Status) -> Status {
    if !super::call::is_runtime(api) {
        return code;
    }
    as_last_error(code)
}

/// `code`, the answer to a runtime call, made the thread's last error. (A
/// code the real runtime call gave is its last error already: set again.)
pub fn as_last_error(code: Status) -> Status {
    // Not during a capture: the echo, an allocation or a free, would be
    // refused and break it where the program's own call may not have.
    if code == SUCCESS || crate::pool::any_capture() {
        return code;
    }
    // The runtime's own driver calls underneath are not the program's.
    let _inside = crate::runtime::guard::Guard::enter();
    // SAFETY: the runtime calls are made to fail: `cudaMalloc` writes at most into `p`, a live local, and the
    // `cudaFree` of the address of a static (host memory, never a device allocation) is refused without
    // touching it.
    unsafe {
        match code {
            // More than any device has (256 TiB): refused, nothing reserved.
            OUT_OF_MEMORY => {
                let mut p = std::ptr::null_mut();
                real!(cudaMalloc(&mut p, 1 << 48));
            }
            // Host memory is no device allocation.
            INVALID_VALUE => {
                static HOST: u64 = 0;
                real!(cudaFree(std::ptr::addr_of!(HOST).cast_mut().cast()));
            }
            _ => {}
        }
    }
    code
}

/// May a runtime call be made twice? Only while the thread has no error
/// left unread: clearing the failed attempt's error would clear that one
/// too. (Driver calls keep no last error.)
pub fn no_error_pending(api: Api) -> bool {
    // SAFETY: `cudaPeekAtLastError` takes no arguments.
    !super::call::is_runtime(api) || unsafe { real!(cudaPeekAtLastError()) } == SUCCESS
}
