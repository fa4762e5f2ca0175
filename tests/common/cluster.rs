//! N real `patterd` processes sharing one PostgreSQL database, behind the round-robin
//! [`Front`](patterd_sim::front::Front): a Kubernetes StatefulSet, its Service and readiness in
//! miniature. Each instance is named `p0`, `p1`, …, advertises its own bound address
//! (`advertise_url = "auto"`) and uses test timings (heartbeat 200 ms, lease 1 s, reaper
//! 200 ms). Webhooks and API calls go through the front; media sockets follow the stream URL
//! in each answer straight to the owner. One set of fakes (Deepgram, ElevenLabs, Hermes,
//! Twilio's REST API) serves every instance. Without PostgreSQL, [`TestCluster::start`] says
//! why and returns `None` (under `PATTERD_REQUIRE_POSTGRES=1` it panics).

use std::net::SocketAddr;
use std::time::Duration;

use patterd_sim::postgres::TestDatabase;
use patterd_sim::twilio::SimTwilio;
use patterd_sim::twilio::call::{SimCall, SimCallConfig};
use patterd_sim::twilio::xml::parse_twiml;

use super::daemon::{Daemon, Fakes};
use patterd_sim::front::Front;

/// `[cluster]` timings of the tests: a lost instance is reaped within about 1.2 s.
pub const TEST_TIMINGS: &str =
    "heartbeat_ms = 200\nlease_ms = 1000\nreaper_ms = 200\nsettings_poll_ms = 1000\n";

/// What every instance of a test cluster is configured with.
pub struct ClusterSpec {
    pub instances: usize,
    pub opts: super::Opts,
    /// Appended to each instance's `[cluster]` table (after the name, URL and timings).
    pub cluster_extra: String,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        Self {
            instances: 3,
            opts: super::Opts::default(),
            cluster_extra: String::new(),
        }
    }
}

/// One inbound call through the front: its id, the simulated caller, and which instance owns
/// it (the one whose address the answer's stream URL named).
pub struct ClusterCall {
    pub call_sid: String,
    pub sim: SimCall,
    pub owner: usize,
}

pub struct TestCluster {
    pub fakes: Fakes,
    /// `None` once an instance was killed or has exited.
    pub nodes: Vec<Option<Daemon>>,
    /// Each instance's bound address (kept after it is gone).
    pub addrs: Vec<SocketAddr>,
    pub front: Front,
    configs: Vec<String>,
    /// Last: dropped after the daemons.
    pub db: TestDatabase,
}

impl TestCluster {
    /// Starts `spec.instances` daemons at the same moment on a fresh database, then the front.
    pub async fn start(spec: ClusterSpec) -> Option<TestCluster> {
        patterd::util::init_tls();
        let db = TestDatabase::create()?;
        let fakes = Fakes::start(spec.opts.transcripts.clone()).await;
        let base = super::config_text(
            &spec.opts,
            &fakes.dg.base_url(),
            &fakes.el.base_url(),
            &fakes.hermes.base_url(),
            &fakes.rest.base_url,
            "",
        );
        let configs: Vec<String> = (0..spec.instances)
            .map(|i| {
                format!(
                    "{base}\n[store]\nbackend = \"postgres\"\nurl = \"{url}\"\n\n[cluster]\n\
                     instance_name = \"p{i}\"\nadvertise_url = \"auto\"\n{TEST_TIMINGS}{extra}\n",
                    url = db.url,
                    extra = spec.cluster_extra,
                )
            })
            .collect();
        let starts: Vec<_> = configs
            .iter()
            .cloned()
            .map(|c| tokio::task::spawn_blocking(move || Daemon::start(&c)))
            .collect();
        let mut nodes = Vec::new();
        for s in starts {
            nodes.push(Some(s.await.expect("daemon start")));
        }
        let addrs: Vec<SocketAddr> = nodes.iter().flatten().map(|d| d.addr).collect();
        let front = Front::start(addrs.clone()).await.expect("front");
        assert!(
            front
                .wait_ready(spec.instances, Duration::from_secs(30))
                .await,
            "every instance became ready"
        );
        Some(TestCluster {
            fakes,
            nodes,
            addrs,
            front,
            configs,
            db,
        })
    }

    /// The instance's name (`p0`, `p1`, …).
    pub fn name(i: usize) -> String {
        format!("p{i}")
    }

    pub fn node(&self, i: usize) -> &Daemon {
        self.nodes[i].as_ref().expect("instance is running")
    }

    /// `http://<instance i>` + `path`, bypassing the front.
    pub fn direct(&self, i: usize, path: &str) -> String {
        format!("http://{}{}", self.addrs[i], path)
    }

    /// `http://<front>` + `path`.
    pub fn shared(&self, path: &str) -> String {
        format!("{}{}", self.front.url(), path)
    }

    pub fn api(&self) -> reqwest::Client {
        super::api_client(super::API_TOKEN)
    }

    /// The Twilio simulator, posting to the front and signing for the shared `public_url`.
    pub fn twilio(&self) -> SimTwilio {
        SimTwilio::new(
            &self.front.url(),
            super::PUBLIC_URL,
            super::ACCOUNT_SID,
            super::AUTH_TOKEN,
        )
    }

    /// The index of the instance listening on `host:port`.
    pub fn index_of(&self, host_port: &str) -> Option<usize> {
        self.addrs.iter().position(|a| a.to_string() == host_port)
    }

    /// A whole inbound Twilio call through the front: signed webhook, TwiML, and the media
    /// stream opened where the TwiML says (the owner's advertise URL).
    pub async fn call(&self) -> ClusterCall {
        let (call_sid, resp) = self
            .twilio()
            .incoming_call("/twilio/voice", super::CALLER, super::OUR_NUMBER)
            .await
            .expect("webhook request");
        assert_eq!(resp.status, 200, "webhook answer: {}", resp.body);
        let answer = parse_twiml(&resp.body).expect("TwiML parses");
        let stream = answer.stream_url.clone().expect("a <Stream> url");
        let host_port = stream
            .split_once("://")
            .map(|(_, r)| r.split('/').next().unwrap_or(r))
            .expect("absolute stream url")
            .to_string();
        let owner = self
            .index_of(&host_port)
            .unwrap_or_else(|| panic!("the stream URL {stream} names no instance"));
        let cfg = SimCallConfig::new(&format!("ws://{host_port}"), super::ACCOUNT_SID, &call_sid);
        let sim = SimCall::from_answer(&answer, cfg)
            .await
            .expect("media stream opens");
        ClusterCall {
            call_sid,
            sim,
            owner,
        }
    }

    /// SIGKILLs instance `i` and waits for it to be gone.
    pub async fn kill(&mut self, i: usize) {
        let mut d = self.nodes[i].take().expect("instance is running");
        d.signal(libc::SIGKILL);
        tokio::task::spawn_blocking(move || {
            d.wait_exit(Duration::from_secs(10));
            drop(d);
        })
        .await
        .expect("kill");
    }

    /// Sends SIGTERM to instance `i` (it drains).
    pub fn terminate(&self, i: usize) {
        self.node(i).signal(libc::SIGTERM);
    }

    /// Waits for instance `i` to exit; returns its exit code.
    pub async fn wait_exit(&mut self, i: usize, timeout: Duration) -> Option<i32> {
        let mut d = self.nodes[i].take().expect("instance is running");
        let (code, d) = tokio::task::spawn_blocking(move || (d.wait_exit(timeout), d))
            .await
            .expect("wait");
        drop(d);
        code
    }

    /// Starts instance `i` again with its configuration (a restarted pod of the same name).
    pub async fn restart(&mut self, i: usize) {
        assert!(self.nodes[i].is_none(), "instance {i} is still running");
        let c = self.configs[i].clone();
        let d = tokio::task::spawn_blocking(move || Daemon::start(&c))
            .await
            .expect("daemon start");
        self.addrs[i] = d.addr;
        self.front.replace(i, d.addr);
        self.nodes[i] = Some(d);
    }

    /// Polls `f` every 20 ms until it returns `Some`, up to `timeout`.
    pub async fn eventually<T, F, Fut>(&self, what: &str, timeout: Duration, mut f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(v) = f().await {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not within {timeout:?}: {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
