//! The training crate's tests, as one binary: each test file is a module, so Burn's generic code
//! is compiled once for all of them instead of once per file. `mixed_precision` stays a binary
//! of its own (it fixes the CPU device's default float dtype for its process).

mod cli;
mod common;
mod data;
mod eval;
mod generate;
mod parallel;
mod plot;
mod resume_config;
mod tokenizer;
mod training;
