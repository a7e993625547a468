//! Where an allocation comes from: the calling thread's native return
//! addresses (`native`) and its innermost Python frames (`python`), read from
//! inside a hook.
//!
//! Rules every function here keeps, because a hook may run on any thread of
//! any program: never take the GIL or any lock the program could hold, never
//! read memory that is not known to be mapped, never panic out, and never
//! symbolise: names and lines are worked out when a report is made.

pub mod native;
pub mod python;
