//! The training crate's tests, as one binary: each test file is a module, so Burn's generic code
//! is compiled once for all of them instead of once per file. A test that changes its whole
//! process (a panic hook, the CPU device's default float dtype) runs in a process of its own,
//! which this binary starts (`common::in_own_process`).

mod cli;
mod cli_needle;
mod common;
mod data;
mod eval;
mod generate;
mod init;
mod mixed_precision;
mod parallel;
mod plot;
mod resume_config;
mod tokenizer;
mod training;
