//! `FakeTranscriptions`: an OpenAI-compatible file transcription server,
//! `POST /v1/audio/transcriptions` (speaches and whisper.cpp's server copy
//! it), as strict as OpenAI's: `Authorization: Bearer <key>` must match when a key is set
//! (401 `invalid_api_key` otherwise; with no key, like a self-hosted server, any or none is
//! accepted), the body must be `multipart/form-data` with a boundary (400), at most 25 MB
//! (413), and well formed; `model` is required, `file` must carry a filename with a supported
//! extension and be a RIFF WAV whose header matches its data (PCM 16-bit, μ-law or A-law), and
//! `response_format` is one of `json`, `text`, `verbose_json`, `srt`, `vtt`. Every error is
//! OpenAI's JSON error object. A good request is answered with the next scripted transcript
//! (`json`: `{"text":…,"usage":{"type":"duration","seconds":…}}`; `text`: the bare text).
//! Failure modes: a status for every request, a queue of statuses for the next requests, and
//! a delay before each answer. Every request is recorded (fields, WAV format, audio length,
//! status).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use hyper::Request;
use hyper::body::Incoming;
use serde_json::json;
use tokio::time::Instant;

use super::http::{self, Body, Recorder, Tasks};

/// OpenAI's upload limit.
pub const MAX_BODY: usize = 25 * 1024 * 1024;
const EXTENSIONS: &[&str] = &[
    "flac", "mp3", "mp4", "mpeg", "mpga", "m4a", "ogg", "wav", "webm",
];

/// Settings of a [`FakeTranscriptions`].
#[derive(Debug, Clone)]
pub struct FakeTranscriptionsConfig {
    /// Empty: no key is checked (a self-hosted server).
    pub api_key: String,
    /// Transcripts handed out in order, one per request.
    pub transcripts: VecDeque<String>,
    /// Used when the queue is empty.
    pub default_transcript: String,
    /// Answer every request with this status (OpenAI's error JSON).
    pub fail_status: Option<u16>,
    /// Statuses for the next requests, one each, before the normal answers resume.
    pub fail_next: VecDeque<u16>,
    /// Wait this long before answering.
    pub delay: Duration,
}

impl Default for FakeTranscriptionsConfig {
    fn default() -> Self {
        Self {
            api_key: "stt-test-key".into(),
            transcripts: VecDeque::new(),
            default_transcript: "hello there".into(),
            fail_status: None,
            fail_next: VecDeque::new(),
            delay: Duration::ZERO,
        }
    }
}

/// The WAV format of an uploaded file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WavFormat {
    /// 1 PCM, 6 A-law, 7 μ-law.
    pub format: u16,
    pub channels: u16,
    pub sample_rate: u32,
    pub bits: u16,
    pub data_bytes: u32,
}

impl WavFormat {
    pub fn audio_ms(&self) -> u64 {
        let per_ms =
            u64::from(self.sample_rate) * u64::from(self.channels) * u64::from(self.bits / 8)
                / 1000;
        u64::from(self.data_bytes) / per_ms.max(1)
    }
}

/// One request.
#[derive(Debug, Clone, Default)]
pub struct TranscriptionRequest {
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// Text form fields, in order.
    pub fields: Vec<(String, String)>,
    pub filename: Option<String>,
    pub wav: Option<WavFormat>,
    /// The decoded samples (16-bit PCM files only).
    pub samples: Vec<i16>,
    pub status: u16,
    /// The transcript answered (successful requests).
    pub text: Option<String>,
    pub at: Option<Instant>,
}

impl TranscriptionRequest {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, Default)]
pub struct TranscriptionsRecord {
    pub requests: Vec<TranscriptionRequest>,
}

impl TranscriptionsRecord {
    /// Requests that were answered 200.
    pub fn ok(&self) -> usize {
        self.requests.iter().filter(|r| r.status == 200).count()
    }
}

struct Shared {
    cfg: Mutex<FakeTranscriptionsConfig>,
    record: Recorder<TranscriptionsRecord>,
    tasks: Tasks,
}

impl http::FakeState for Shared {
    fn tasks(&self) -> &Tasks {
        &self.tasks
    }
}

/// A running fake; dropping it stops the server.
pub struct FakeTranscriptions(http::Server<Shared>);

impl FakeTranscriptions {
    pub async fn start_with(cfg: FakeTranscriptionsConfig) -> std::io::Result<Self> {
        let shared = Shared {
            cfg: Mutex::new(cfg),
            record: Recorder::default(),
            tasks: Tasks::default(),
        };
        Ok(Self(http::Server::start(shared, handle).await?))
    }

    /// `http://127.0.0.1:PORT/v1`, the `base_url` to configure.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.0.addr)
    }

    pub fn configure(&self, f: impl FnOnce(&mut FakeTranscriptionsConfig)) {
        if let Ok(mut c) = self.0.shared.cfg.lock() {
            f(&mut c);
        }
    }

    pub fn record(&self) -> TranscriptionsRecord {
        self.0.shared.record.snapshot()
    }

    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&TranscriptionsRecord) -> bool,
    ) -> TranscriptionsRecord {
        self.0.shared.record.wait_until(what, pred).await
    }
}

/// OpenAI's error object.
fn error(
    status: u16,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> hyper::Response<Body> {
    http::json(
        status,
        &json!({"error": {"message": message, "type": kind, "param": param, "code": code}}),
    )
}

fn invalid(message: &str, param: Option<&str>) -> hyper::Response<Body> {
    error(400, message, "invalid_request_error", param, None)
}

async fn handle(shared: std::sync::Arc<Shared>, req: Request<Incoming>) -> hyper::Response<Body> {
    let mut rec = TranscriptionRequest {
        path: req.uri().path().to_string(),
        headers: http::header_pairs(&req),
        at: Some(Instant::now()),
        ..Default::default()
    };
    let (resp, status) = answer(&shared, req, &mut rec).await;
    rec.status = status;
    shared.record.modify(|r| r.requests.push(rec));
    resp
}

/// A response and its status (for the record).
type Answer = (hyper::Response<Body>, u16);

async fn answer(shared: &Shared, req: Request<Incoming>, rec: &mut TranscriptionRequest) -> Answer {
    let cfg = match shared.cfg.lock() {
        Ok(c) => c.clone(),
        Err(_) => return (invalid("fake poisoned", None), 500),
    };
    let checked = async {
        let boundary = check_request(&cfg, &req)?;
        let file = read_form(req, &boundary, rec).await?;
        let format = check_upload(&file, rec)?;
        Ok::<Answer, Box<Answer>>(reply(shared, &cfg, &format, rec).await)
    };
    match checked.await {
        Ok(a) => a,
        Err(a) => *a,
    }
}

/// The path, method, key and content type; the multipart boundary.
fn check_request(
    cfg: &FakeTranscriptionsConfig,
    req: &Request<Incoming>,
) -> Result<String, Box<Answer>> {
    if req.uri().path() != "/v1/audio/transcriptions" {
        let msg = format!("Invalid URL ({} {})", req.method(), req.uri().path());
        return Err(Box::new((
            error(404, &msg, "invalid_request_error", None, None),
            404,
        )));
    }
    if req.method() != hyper::Method::POST {
        return Err(Box::new((
            error(
                405,
                "Method not allowed",
                "invalid_request_error",
                None,
                None,
            ),
            405,
        )));
    }
    if !cfg.api_key.is_empty() && !http::authorized(req, &format!("Bearer {}", cfg.api_key)) {
        let msg = "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.";
        return Err(Box::new((
            error(
                401,
                msg,
                "invalid_request_error",
                None,
                Some("invalid_api_key"),
            ),
            401,
        )));
    }
    let ctype = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    boundary_of(&ctype).ok_or_else(|| {
        Box::new((
            invalid(
                "Invalid Content-Type header: expected multipart/form-data with a boundary",
                None,
            ),
            400,
        ))
    })
}

/// Reads the multipart form into `rec` (file name, other fields); the file, with a model.
async fn read_form(
    req: Request<Incoming>,
    boundary: &str,
    rec: &mut TranscriptionRequest,
) -> Result<Vec<u8>, Box<Answer>> {
    let body = match http::read_body(req, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return Err(Box::new((
                error(
                    413,
                    "Maximum content size limit (26214400) exceeded",
                    "invalid_request_error",
                    None,
                    None,
                ),
                413,
            )));
        }
    };
    let parts = match parse_multipart(&body, boundary) {
        Ok(p) => p,
        Err(e) => {
            return Err(Box::new((
                invalid(&format!("Could not parse multipart form: {e}"), None),
                400,
            )));
        }
    };
    let mut file = None;
    for p in parts {
        if p.name == "file" {
            rec.filename = p.filename.clone();
            file = Some(p.data);
        } else {
            rec.fields
                .push((p.name, String::from_utf8_lossy(&p.data).into_owned()));
        }
    }
    let Some(file) = file else {
        return Err(Box::new((
            invalid("you must provide a file parameter", Some("file")),
            400,
        )));
    };
    if rec.field("model").is_none_or(str::is_empty) {
        return Err(Box::new((
            invalid("you must provide a model parameter", Some("model")),
            400,
        )));
    }
    Ok(file)
}

/// The file's extension, the response format and the WAV itself (into `rec`); the format.
fn check_upload(file: &[u8], rec: &mut TranscriptionRequest) -> Result<String, Box<Answer>> {
    let ext_ok = rec
        .filename
        .as_deref()
        .and_then(|f| f.rsplit_once('.'))
        .is_some_and(|(_, e)| EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()));
    if !ext_ok {
        return Err(Box::new((
            invalid(
                &format!("Invalid file format. Supported formats: {EXTENSIONS:?}"),
                Some("file"),
            ),
            400,
        )));
    }
    let format = rec.field("response_format").unwrap_or("json").to_string();
    if !["json", "text", "verbose_json", "srt", "vtt"].contains(&format.as_str()) {
        return Err(Box::new((
            invalid(
                &format!(
                    "'{format}' is not one of ['json', 'text', 'srt', 'verbose_json', 'vtt'] - 'response_format'"
                ),
                Some("response_format"),
            ),
            400,
        )));
    }
    match parse_wav(file) {
        Ok((wav, samples)) => {
            rec.wav = Some(wav);
            rec.samples = samples;
        }
        Err(e) => {
            return Err(Box::new((
                invalid(
                    &format!("Audio file could not be decoded or its format is not supported: {e}"),
                    Some("file"),
                ),
                400,
            )));
        }
    }
    Ok(format)
}

/// A well-formed request: the forced failure if one is queued, else the next transcript in
/// `format`.
async fn reply(
    shared: &Shared,
    cfg: &FakeTranscriptionsConfig,
    format: &str,
    rec: &mut TranscriptionRequest,
) -> Answer {
    let forced = {
        let mut c = match shared.cfg.lock() {
            Ok(c) => c,
            Err(_) => return (invalid("fake poisoned", None), 500),
        };
        c.fail_next.pop_front().or(c.fail_status)
    };
    if !cfg.delay.is_zero() {
        tokio::time::sleep(cfg.delay).await;
    }
    if let Some(status) = forced {
        let (kind, msg) = match status {
            429 => ("requests", "Rate limit reached for requests"),
            s if s >= 500 => (
                "server_error",
                "The server had an error while processing your request. Sorry about that!",
            ),
            _ => ("invalid_request_error", "Request refused"),
        };
        return (error(status, msg, kind, None, None), status);
    }
    let text = match shared.cfg.lock() {
        Ok(mut c) => c
            .transcripts
            .pop_front()
            .unwrap_or_else(|| c.default_transcript.clone()),
        Err(_) => return (invalid("fake poisoned", None), 500),
    };
    rec.text = Some(text.clone());
    let seconds = rec.wav.map_or(0.0, |w| w.audio_ms() as f64 / 1000.0);
    let resp = match format {
        "text" => http::full(200, "text/plain; charset=utf-8", format!("{text}\n")),
        "json" => http::json(
            200,
            &json!({"text": text, "usage": {"type": "duration", "seconds": seconds.ceil()}}),
        ),
        _ => http::json(
            200,
            &json!({"task": "transcribe", "language": "english", "duration": seconds, "text": text, "segments": [], "usage": {"type": "duration", "seconds": seconds.ceil()}}),
        ),
    };
    (resp, 200)
}

/// The `boundary` parameter of a `multipart/form-data` content type.
fn boundary_of(ctype: &str) -> Option<String> {
    let mut it = ctype.split(';');
    if !it
        .next()?
        .trim()
        .eq_ignore_ascii_case("multipart/form-data")
    {
        return None;
    }
    it.filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim_matches('"').to_string())
        .filter(|b| !b.is_empty() && b.len() <= 70)
}

struct Part {
    name: String,
    filename: Option<String>,
    data: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// RFC 7578 parsing, strict: the body starts with the first delimiter, every part has a
/// `Content-Disposition: form-data; name=…` header, and the close delimiter ends it.
fn parse_multipart(body: &[u8], boundary: &str) -> Result<Vec<Part>, String> {
    let delim = format!("--{boundary}");
    let next_delim = format!("\r\n--{boundary}");
    if !body.starts_with(delim.as_bytes()) {
        return Err("the body does not start with the boundary".into());
    }
    let mut pos = delim.len();
    let mut parts = Vec::new();
    loop {
        if body[pos..].starts_with(b"--") {
            return if parts.is_empty() {
                Err("no parts".into())
            } else {
                Ok(parts)
            };
        }
        if !body[pos..].starts_with(b"\r\n") {
            return Err("a boundary is not followed by CRLF".into());
        }
        pos += 2;
        let head_end = find(body, b"\r\n\r\n", pos).ok_or("a part has no header end")?;
        let head =
            std::str::from_utf8(&body[pos..head_end]).map_err(|_| "a part header is not UTF-8")?;
        let disp = head
            .split("\r\n")
            .find_map(|l| {
                l.split_once(':')
                    .filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
                    .map(|(_, v)| v.trim().to_string())
            })
            .ok_or("a part has no Content-Disposition")?;
        let mut params = disp.split(';').map(str::trim);
        if params.next() != Some("form-data") {
            return Err("a part's Content-Disposition is not form-data".into());
        }
        let mut name = None;
        let mut filename = None;
        for p in params {
            if let Some((k, v)) = p.split_once('=') {
                let v = v.trim_matches('"').to_string();
                match k {
                    "name" => name = Some(v),
                    "filename" => filename = Some(v),
                    _ => {}
                }
            }
        }
        let name = name.ok_or("a part has no name")?;
        let data_start = head_end + 4;
        let data_end = find(body, next_delim.as_bytes(), data_start)
            .ok_or("the closing boundary is missing")?;
        parts.push(Part {
            name,
            filename,
            data: body[data_start..data_end].to_vec(),
        });
        pos = data_end + next_delim.len();
    }
}

/// A RIFF WAV's format and (16-bit PCM) samples; errors when the header and data disagree.
fn parse_wav(b: &[u8]) -> Result<(WavFormat, Vec<i16>), String> {
    let u32_at = |i: usize| {
        b.get(i..i + 4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    };
    let u16_at = |i: usize| b.get(i..i + 2).map(|s| u16::from_le_bytes([s[0], s[1]]));
    if b.get(0..4) != Some(b"RIFF") || b.get(8..12) != Some(b"WAVE") {
        return Err("not a RIFF WAVE file".into());
    }
    if u32_at(4).map(|n| n as usize + 8) != Some(b.len()) {
        return Err("the RIFF size does not match the file".into());
    }
    let mut pos = 12;
    let mut fmt = None;
    while pos + 8 <= b.len() {
        let id = &b[pos..pos + 4];
        let size = u32_at(pos + 4).ok_or("truncated chunk")? as usize;
        let body = pos + 8;
        if body + size > b.len() {
            return Err(format!(
                "chunk {:?} runs past the end",
                String::from_utf8_lossy(id)
            ));
        }
        if id == b"fmt " {
            let f = WavFormat {
                format: u16_at(body).ok_or("short fmt")?,
                channels: u16_at(body + 2).ok_or("short fmt")?,
                sample_rate: u32_at(body + 4).ok_or("short fmt")?,
                bits: u16_at(body + 14).ok_or("short fmt")?,
                data_bytes: 0,
            };
            let byte_rate = u32_at(body + 8).ok_or("short fmt")?;
            let align = u16_at(body + 12).ok_or("short fmt")?;
            let valid = matches!((f.format, f.bits), (1, 16) | (6, 8) | (7, 8))
                && f.channels >= 1
                && (8000..=48000).contains(&f.sample_rate)
                && align == f.channels * f.bits / 8
                && byte_rate == f.sample_rate * u32::from(align);
            if !valid {
                return Err(format!("unsupported or inconsistent fmt chunk {f:?}"));
            }
            fmt = Some(f);
        } else if id == b"data" {
            let mut f = fmt.ok_or("data before fmt")?;
            f.data_bytes = size as u32;
            if size == 0 {
                return Err("no audio".into());
            }
            let samples = if f.format == 1 {
                b[body..body + size]
                    .chunks_exact(2)
                    .map(|s| i16::from_le_bytes([s[0], s[1]]))
                    .collect()
            } else {
                Vec::new()
            };
            return Ok((f, samples));
        }
        pos = body + size + (size & 1);
    }
    Err("no data chunk".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_and_wav_round_trip() {
        let wav = patterd::provider::openai_stt::wav_from_ulaw(&[0x7F; 800]);
        let body = patterd::provider::openai_stt::multipart(
            "b0",
            &[("model", "whisper-1")],
            "u.wav",
            &wav,
        );
        let parts = parse_multipart(&body, "b0").expect("parses");
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "model");
        assert_eq!(parts[0].data, b"whisper-1");
        assert_eq!(parts[1].filename.as_deref(), Some("u.wav"));
        let (f, s) = parse_wav(&parts[1].data).expect("wav");
        assert_eq!(
            (f.format, f.channels, f.sample_rate, f.bits),
            (1, 1, 8000, 16)
        );
        assert_eq!(f.audio_ms(), 100);
        assert_eq!(s.len(), 800);
    }

    #[test]
    fn broken_bodies_are_refused() {
        assert!(parse_multipart(b"garbage", "b0").is_err());
        assert!(
            parse_multipart(
                b"--b0\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nx",
                "b0"
            )
            .is_err()
        );
        assert!(parse_wav(b"RIFF\x04\x00\x00\x00WAVE").is_err());
        let mut wav = patterd::provider::openai_stt::wav_from_ulaw(&[0x7F; 10]);
        wav.truncate(wav.len() - 2);
        assert!(parse_wav(&wav).is_err(), "size mismatch");
        assert_eq!(
            boundary_of("multipart/form-data; boundary=\"abc\"").as_deref(),
            Some("abc")
        );
        assert_eq!(boundary_of("application/json"), None);
    }
}
