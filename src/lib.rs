//! longhaul: an inference engine for Mixture-of-Experts language models in
//! GGUF that keeps dense weights resident and streams routed experts into a
//! fixed-budget per-layer cache. See DESIGN.md in the shared folder for the map.

pub mod alloc;
pub mod backend;
pub mod clock;
pub mod constrain;
pub mod draft;
pub mod engine;
pub mod errors;
pub mod gguf;
pub mod kv;
pub mod longhaul;
pub mod mem;
pub mod model;
pub mod placement;
pub mod quant;
pub mod sample;
pub mod scheduler;
pub mod spec;
pub mod state;
pub mod statefile;
pub mod synth;
pub mod tensor;
pub mod threads;
pub mod tokenizer;
pub mod toolcall;
