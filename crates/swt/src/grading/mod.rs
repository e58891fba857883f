//! SWT-bench grading, pure: the seven log-parser families (and reprobench's `unittest`), how
//! SWT-bench reads one execution's log, its rules in both versions, and one instance graded from
//! its six logs with reprobench's own checks beside the verdict.
//!
//! Parity means identical results: the same six logs give the same `resolved`, `applicable`,
//! F→X, F→P, P→P and test categories as SWT-bench's code (logic-star-ai/swt-bench at 330a649 for
//! `swt-bench-2025-09`, the parent of 0816600 for `swt-bench-2024`). The tests under
//! `tests/grade_parity.rs` check it on `../shared/data/swt-parity`.

pub mod coverage;
pub mod execution_log;
pub mod injection;
pub mod instance;
pub mod parsers;
pub mod pytext;
pub mod rules;

pub use instance::{InstanceGrade, NotGraded, RUNS, RunInput, Suspicion, grade};
pub use parsers::{Family, StatusMap, TestStatus};
pub use rules::{Categories, Category, Rules};
