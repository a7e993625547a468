//! Stream capture, at the runtime and the driver level: while a capture is
//! under way the pool hands out nothing (see `intercept::capture`).

#![allow(non_snake_case)]

use super::{entry, twins};
use crate::cuda::{cudaStream_t, CUstream};
use crate::intercept;
use crate::real;
use std::ffi::{c_int, c_void};

type Ptr = *mut c_void;

twins!(cudaStreamBeginCapture / cudaStreamBeginCapture_ptsz (stream: cudaStream_t, mode: c_int) |real, per_thread| {
    intercept::capture_begin(stream as u64, per_thread, || real!([real](stream, mode)))
});

twins!(cudaStreamBeginCaptureToGraph / cudaStreamBeginCaptureToGraph_ptsz (stream: cudaStream_t, graph: Ptr,
    deps: *const Ptr, edges: *const c_void, count: usize, mode: c_int) |real, per_thread| {
    intercept::capture_begin(stream as u64, per_thread, || real!([real](stream, graph, deps, edges, count, mode)))
});

twins!(cudaStreamEndCapture / cudaStreamEndCapture_ptsz (stream: cudaStream_t, graph: *mut Ptr) |real, per_thread| {
    intercept::capture_end(stream as u64, per_thread, || real!([real](stream, graph)))
});

twins!(cuStreamBeginCapture / cuStreamBeginCapture_ptsz (stream: CUstream) |real, per_thread| {
    intercept::capture_begin(stream as u64, per_thread, || real!([real](stream)))
});

twins!(cuStreamBeginCapture_v2 / cuStreamBeginCapture_v2_ptsz (stream: CUstream, mode: c_int) |real, per_thread| {
    intercept::capture_begin(stream as u64, per_thread, || real!([real](stream, mode)))
});

twins!(cuStreamBeginCaptureToGraph / cuStreamBeginCaptureToGraph_ptsz (stream: CUstream, graph: Ptr,
    deps: *const Ptr, edges: *const c_void, count: usize, mode: c_int) |real, per_thread| {
    intercept::capture_begin(stream as u64, per_thread, || real!([real](stream, graph, deps, edges, count, mode)))
});

twins!(cuStreamEndCapture / cuStreamEndCapture_ptsz (stream: CUstream, graph: *mut Ptr) |real, per_thread| {
    intercept::capture_end(stream as u64, per_thread, || real!([real](stream, graph)))
});

pub static DRIVER_TABLE: &[super::Entry] = &[
    entry!(cuStreamBeginCapture),
    entry!(cuStreamBeginCapture_ptsz),
    entry!(cuStreamBeginCapture_v2),
    entry!(cuStreamBeginCapture_v2_ptsz),
    entry!(cuStreamBeginCaptureToGraph),
    entry!(cuStreamBeginCaptureToGraph_ptsz),
    entry!(cuStreamEndCapture),
    entry!(cuStreamEndCapture_ptsz),
];

pub static RUNTIME_TABLE: &[super::Entry] = &[
    entry!(cudaStreamBeginCapture),
    entry!(cudaStreamBeginCapture_ptsz),
    entry!(cudaStreamBeginCaptureToGraph),
    entry!(cudaStreamBeginCaptureToGraph_ptsz),
    entry!(cudaStreamEndCapture),
    entry!(cudaStreamEndCapture_ptsz),
];
