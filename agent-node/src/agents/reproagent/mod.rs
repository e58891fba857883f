//! The ReProAgent approach: localization, root-cause analysis, test planning, generation and review.
