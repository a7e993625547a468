pub mod finding;
pub mod github;
pub mod json;
pub mod per_test;
pub mod sarif;
