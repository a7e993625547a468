fn main() { println!("{}", cupool_core::x()); }
