//! The SWT track on a node: agents that produce a test patch (`gold`, `issue-snippet`, given
//! predictions), and evaluation with SWT-bench semantics in a sandbox.

pub mod case;
pub mod evaluate;
pub mod grading;
pub mod mirror;
pub mod patch;
pub mod script;
pub mod snippet;
