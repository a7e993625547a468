#[no_mangle] pub extern "C" fn dlsym_test() -> u32 { cupool_core::x() }
