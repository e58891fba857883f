//! Process sandbox (being written).
