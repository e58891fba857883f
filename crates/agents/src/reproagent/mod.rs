//! The ReProAgent approach: localization, root-cause analysis, test planning, generation and review.
//!
//! A multi-stage agent (after "ReProAgent", sections 3–4): hierarchical bug localization
//! (files → functions/classes → lines), root-cause analysis along the execution path,
//! assertion-aware test planning, then test generation with execution feedback and a triadic
//! review (issue, test, execution result). Each analysis stage is a tool-using conversation over
//! the [`Workspace`](crate::Workspace) tools plus a built-in `sequential_thinking`
//! reflection tool, ending in a JSON answer ([`Localization`], [`RootCause`], [`TestPlan`]).
//! Generation answers with a path and a ```python block; the test is run on the buggy code,
//! pre-checked deterministically ([`classify_run`]: a pass or a setup error is rejected without
//! asking the model), and reviewed by the model ([`ReviewVerdict`]); a rejected test is sent back
//! with the output and verdict for regeneration.
//!
//! Each system prompt starts with the marker line `reproagent stage: <stage>` where `<stage>` is
//! `localization`, `root-cause`, `planning`, `generation` or `review` ([`prompts::stage_marker`]).
//! The module does no IO of its own: everything goes through the `Llm` and `Workspace` traits.

mod agent;
pub mod parse;
pub mod prompts;
mod types;

#[cfg(test)]
mod tests;

pub use agent::{
    DEFAULT_TEST_PATH, LOCALIZATION_TOP_K, Limits, MAX_TOOL_RESULT_CHARS, ReproOutcome, Step,
    UnknownVariant, Variant, localized_files_correct, run,
};
pub use parse::{RunSignal, classify_run, new_file_patch};
pub use prompts::Stage;
pub use types::{
    Localization, ReviewVerdict, RootCause, StageOutput, Suspect, SuspectLines, TestPlan,
    confidence_from_value, normalize_repo_path,
};
