//! Training data: documents from files, tokenised, packed into windows, split by document hash.

pub mod batch;
pub mod corpus;
pub mod passkey;
pub mod sources;
pub mod synthetic;
pub mod tokenizer;
