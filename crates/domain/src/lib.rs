//! The vocabulary every reprobench crate shares, with no wire format and no IO beyond reading
//! dataset files: sweep specs, the registry of agents and executor kinds, the synthetic, SWT and
//! Android datasets and their loaders, grading vocabulary, secrets, and the versioned results schema that `reprobench-analysis` reads.

pub mod android;
pub mod dataset_kind;
pub mod grading;
pub mod ids;
pub mod kind;
pub mod messages;
pub mod outcome;
pub mod registry;
pub mod results;
pub mod secret;
pub mod sweep;
pub mod swt;
pub mod swt_bench;
pub mod sync;
pub mod synthetic;
pub mod time;
