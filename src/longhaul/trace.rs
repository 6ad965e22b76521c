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
        writeln!(
            out,
            r#"{{"longhaul_trace":1,"n_layer":{n_layer},"n_expert":{n_expert},"n_expert_used":{n_expert_used}}}"#
        )?;
        Ok(Self {
            out: Mutex::new(out),
        })
    }

    /// Records the `ids` (`[tokens, n_used]`) chosen in `layer`.
    pub fn record(&self, layer: usize, ids: &[u32], n_used: usize) -> std::io::Result<()> {
        let mut line = format!(r#"{{"layer":{layer},"ids":["#);
        for (i, tok) in ids.chunks(n_used.max(1)).enumerate() {
            if i > 0 {
                line.push(',');
            }
            line.push('[');
            for (j, e) in tok.iter().enumerate() {
                if j > 0 {
                    line.push(',');
                }
                line.push_str(&e.to_string());
            }
            line.push(']');
        }
        line.push_str("]}\n");
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        out.write_all(line.as_bytes())
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
