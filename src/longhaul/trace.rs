//! Routing traces: which experts each token chose in each MoE layer, one
//! JSON line per (batch, layer), for replay by the cache advisor.
//!
//! Format (JSONL): a header line
//! `{"longhaul_trace":1,"n_layer":48,"n_expert":128,"n_expert_used":8}`,
//! then `{"layer":L,"ids":[[e, ...], ...]}` with one inner list per token of
//! the batch, in the order the sync points ran.

use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use serde_json::json;

/// Appends routing decisions to a trace file.
pub struct TraceWriter {
    out: Mutex<BufWriter<std::fs::File>>,
}

impl TraceWriter {
    pub fn create(
        path: &Path,
        n_layer: usize,
        n_expert: usize,
        n_expert_used: usize,
    ) -> std::io::Result<Self> {
        let mut out = BufWriter::new(std::fs::File::create(path)?);
        // Keys stay in the order written (serde_json's `preserve_order`).
        let header = json!({
            "longhaul_trace": 1,
            "n_layer": n_layer,
            "n_expert": n_expert,
            "n_expert_used": n_expert_used,
        });
        writeln!(out, "{header}")?;
        Ok(Self {
            out: Mutex::new(out),
        })
    }

    /// Records the `ids` (`[tokens, n_used]`) chosen in `layer`.
    pub fn record(&self, layer: usize, ids: &[u32], n_used: usize) -> std::io::Result<()> {
        let per_token: Vec<&[u32]> = ids.chunks(n_used.max(1)).collect();
        let line = json!({ "layer": layer, "ids": per_token });
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        writeln!(out, "{line}")
    }

    /// Flushes buffered lines to the file.
    pub fn flush(&self) -> std::io::Result<()> {
        self.out.lock().unwrap_or_else(|p| p.into_inner()).flush()
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_the_documented_format() {
        let path =
            std::env::temp_dir().join(format!("longhaul-trace-{}.jsonl", std::process::id()));
        let w = TraceWriter::create(&path, 48, 128, 2).unwrap();
        w.record(3, &[7, 1, 0, 127], 2).unwrap();
        w.record(0, &[], 2).unwrap();
        drop(w);
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        // The module doc's format, byte for byte (key order included).
        assert_eq!(
            text,
            "{\"longhaul_trace\":1,\"n_layer\":48,\"n_expert\":128,\"n_expert_used\":2}\n\
             {\"layer\":3,\"ids\":[[7,1],[0,127]]}\n\
             {\"layer\":0,\"ids\":[]}\n"
        );
    }
}
