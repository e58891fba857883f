//! SWT-bench's semantics, apart from any executor: grading (a pure module tree that turns test
//! logs into verdicts exactly as SWT-bench does), patches and test directives, the evaluation
//! script that runs in a sandbox and the report it prints, parity cases, issue snippets, and
//! repository mirrors.
//!
//! The executor that runs an agent and grades its patch in a sandbox is the node's
//! (`reprobench-agent-node`'s `swt_executor`), since it wires agents, sandboxes and this crate.

pub mod bench;
pub mod case;
pub mod grading;
pub mod mirror;
pub mod patch;
pub mod script;
pub mod snippet;
