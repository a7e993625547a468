pub mod finding;
pub mod per_test;
