//! The processes of a run: the fakes (Deepgram, ElevenLabs, Hermes, Twilio's REST API) the
//! server talks to, the server under test spawned with its generated config (or any command),
//! and the wait for its first healthy answer (the cold start).

use super::*;

/// Picks a free loopback port (bind to 0, read it, let it go).
pub(super) fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

pub(super) fn patterd_config(
    port: u16,
    calls: usize,
    dg: &str,
    el: &str,
    hermes: &str,
    rest: &str,
) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:{port}"
public_url = "{PUBLIC_URL}"
api_token = "{API_TOKEN}"
max_calls = {max_calls}
max_connections = {max_conns}
drain_timeout_s = 5
data_dir = "{data_dir}"

[log]
format = "json"
level = "info"

[llm.hermes]
kind = "hermes"
base_url = "{hermes}"
api_key = "{HERMES_KEY}"
model = "hermes-agent"

{sim_sections}

[agents.bench]
system_prompt = "You are a benchmark agent."
first_message = "Hello, thanks for calling."
llm = "hermes"
stt = "deepgram"
tts = "elevenlabs"

[[numbers]]
number = "{OUR_NUMBER}"
carrier = "twilio"
agent = "bench"
"#,
        max_calls = calls + 16,
        // A store of the run's own: never the machine's /var/lib/patterd, which another build of
        // patterd (another schema) may own, and which runs side by side would share.
        data_dir = std::env::temp_dir()
            .join(format!("patterd-loadgen-{}-{port}", std::process::id()))
            .display(),
        sim_sections = patterd_sim::config::SimSections {
            deepgram: (dg, DG_KEY),
            elevenlabs: (el, EL_KEY),
            twilio_rest: rest,
            account_sid: ACCOUNT_SID,
            auth_token: AUTH_TOKEN,
        }
        .toml(),
        max_conns = (calls * 4).max(4096),
    )
}

/// The server process and where it listens.
pub(super) struct Server {
    pub(super) child: Child,
    pub(super) addr: SocketAddr,
    pub(super) cold_start: Duration,
    pub(super) _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) struct Fakes {
    pub(super) dg: FakeDeepgram,
    pub(super) el: FakeElevenLabs,
    pub(super) hermes: FakeHermes,
    pub(super) rest: FakeTwilioRest,
}

/// Twenty seconds of the fake ElevenLabs' tone, computed once: as its `voice`, the fake
/// answers every request with a prefix of it, the same bytes it would synthesise (a 440 Hz
/// tone from phase 0) without computing a sine per sample per request.
pub(super) fn prebuilt_tts_tone() -> Arc<Vec<u8>> {
    Arc::new(patterd_sim::tone::mulaw_tone(20_000))
}

pub(super) async fn start_fakes() -> std::io::Result<Fakes> {
    let dg = FakeDeepgram::start_with(FakeDeepgramConfig {
        api_key: DG_KEY.into(),
        default_transcript: CALLER_SAYS.into(),
        idle_timeout: Duration::from_secs(60),
        record_frames: false,
        ..Default::default()
    })
    .await?;
    let el = FakeElevenLabs::start_with(FakeElevenLabsConfig {
        api_key: EL_KEY.into(),
        first_chunk_delay: Duration::ZERO,
        chunk_interval: Duration::ZERO,
        voice: Some(prebuilt_tts_tone()),
        ..Default::default()
    })
    .await?;
    let hermes = FakeHermes::start(HERMES_KEY).await?;
    let rest = FakeTwilioRest::start(ACCOUNT_SID, AUTH_TOKEN).await?;
    Ok(Fakes {
        dg,
        el,
        hermes,
        rest,
    })
}

/// `program`, run through `taskset -c CPUS` when the server is pinned (taskset execs it, so
/// the child's pid is the server's).
pub(super) fn pinned(opts: &Options, program: &std::ffi::OsStr) -> Command {
    match &opts.server_cpus {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpus).arg(program);
            c
        }
        None => Command::new(program),
    }
}

pub(super) fn spawn_server(opts: &Options, fakes: &Fakes) -> Result<Server, String> {
    spawn_server_with(opts, fakes, "", "")
}

/// [`spawn_server`] with `extra` appended to a patterd config (the cluster's `[store]` and
/// `[cluster]`), its log named with `name`.
pub(super) fn spawn_server_with(
    opts: &Options,
    fakes: &Fakes,
    extra: &str,
    name: &str,
) -> Result<Server, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let port = free_port().map_err(|e| e.to_string())?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let log_dir = opts.log_dir.clone().unwrap_or_else(|| dir.path().into());
    let _ = std::fs::create_dir_all(&log_dir);
    let log_path = log_dir.join(format!("{}-{}{name}.log", opts.label, opts.calls));
    let log = std::fs::File::create(&log_path).map_err(|e| format!("{log_path:?}: {e}"))?;
    let mut cmd = match &opts.target {
        Target::Patterd { bin } => {
            let cfg = dir.path().join("patter.toml");
            let text = patterd_config(
                port,
                opts.calls,
                &fakes.dg.base_url(),
                &fakes.el.base_url(),
                &fakes.hermes.base_url(),
                &fakes.rest.base_url,
            ) + extra;
            std::fs::write(&cfg, text).map_err(|e| e.to_string())?;
            let mut c = pinned(opts, bin.as_os_str());
            c.arg("--config")
                .arg(&cfg)
                .env_remove("RUST_LOG")
                .env("PATTERD_DATA_DIR", dir.path());
            c
        }
        Target::Command { shell } => {
            let mut c = pinned(opts, "sh".as_ref());
            c.arg("-c").arg(shell);
            c
        }
    };
    cmd.env("BENCH_PORT", port.to_string())
        .env("BENCH_PUBLIC_URL", PUBLIC_URL)
        .env("BENCH_ACCOUNT_SID", ACCOUNT_SID)
        .env("BENCH_AUTH_TOKEN", AUTH_TOKEN)
        .env("BENCH_NUMBER", OUR_NUMBER)
        .env("BENCH_DEEPGRAM_URL", fakes.dg.base_url())
        .env("BENCH_DEEPGRAM_KEY", DG_KEY)
        .env("BENCH_ELEVENLABS_URL", fakes.el.base_url())
        .env("BENCH_ELEVENLABS_KEY", EL_KEY)
        .env("BENCH_HERMES_URL", fakes.hermes.base_url())
        .env("BENCH_HERMES_KEY", HERMES_KEY)
        .env("BENCH_TWILIO_REST_URL", &fakes.rest.base_url)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    let t = std::time::Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("spawn server: {e}"))?;
    let cold_start = loop {
        if http_status(addr, &opts.health_path) == Some(200) {
            break t.elapsed();
        }
        if let Ok(Some(st)) = child.try_wait() {
            return Err(format!("server exited early ({st}); log: {log_path:?}"));
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            return Err(format!("server not healthy after 60 s; log: {log_path:?}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    Ok(Server {
        child,
        addr,
        cold_start,
        _dir: dir,
    })
}
