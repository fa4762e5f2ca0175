//! Placeholder sentence chunker (replaced by the providers branch).

#[derive(Default)]
pub struct SentenceChunker {
    buf: String,
}

impl SentenceChunker {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn push(&mut self, delta: &str) -> Vec<String> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        while let Some(i) = self.buf.find(". ") {
            let s: String = self.buf.drain(..=i).collect();
            out.push(s.trim().to_string());
        }
        out
    }
    pub fn finish(&mut self) -> Option<String> {
        let s = std::mem::take(&mut self.buf);
        let s = s.trim();
        (!s.is_empty()).then(|| s.to_string())
    }
}

pub fn speakable(text: &str) -> String {
    text.trim().to_string()
}
