pub fn x() -> u32 { 1 }
