//! What each provider kind does, from the registration lists in `config::schema::kinds`
//! (`stt_kinds!`, `tts_kinds!`, `llm_kinds!`): every entry names the provider type that serves
//! its kind, and that type implements [`SttKind`]'s, [`TtsKind`]'s or [`LlmKind`]'s trait here
//! ([`SttKindImpl`], [`TtsKindImpl`], [`LlmKindImpl`]) in its own file: how it is built from
//! its table and (speech kinds) the doctor's one cheap authenticated request. [`build_stt`],
//! [`build_tts`], [`build_llm`], [`stt_credential_check`] and [`tts_credential_check`]
//! dispatch on the kind through the lists, so a new kind is its file plus its entry.

use std::sync::Arc;

use super::error::SetupError;
use super::{LlmProvider, SttProvider, TtsProvider};
use crate::config::schema::{LlmConfig, LlmKind, SttConfig, SttKind, TtsConfig, TtsKind};
use crate::config::schema::{llm_kinds, stt_kinds, tts_kinds};

/// A speech-to-text kind's provider type.
pub(crate) trait SttKindImpl: SttProvider + Sized + 'static {
    /// The provider for one `[stt.NAME]` table.
    fn build(cfg: &SttConfig) -> Result<Self, SetupError>;
    /// `patterd doctor`'s request for the table's `api_key` (401/403: rejected); `None` for a
    /// kind without credentials (the in-process `whisper`).
    fn credential_check(
        cfg: &SttConfig,
        client: &reqwest::Client,
    ) -> Option<reqwest::RequestBuilder>;
}

/// A text-to-speech kind's provider type.
pub(crate) trait TtsKindImpl: TtsProvider + Sized + 'static {
    /// The provider for one `[tts.NAME]` table (its kind's defaults filled in).
    fn build(cfg: &TtsConfig) -> Result<Self, SetupError>;
    /// `patterd doctor`'s request for the table's `api_key` (401/403: rejected); `None` for an
    /// engine that runs on this machine and has no account.
    fn credential_check(
        cfg: &TtsConfig,
        client: &reqwest::Client,
    ) -> Option<reqwest::RequestBuilder>;
}

/// A brain kind's provider type. The doctor's brain checks (`/models` with the key, and
/// Hermes' own) are the same for every kind that speaks Chat Completions.
pub(crate) trait LlmKindImpl: LlmProvider + Sized + 'static {
    /// The provider for one `[llm.NAME]` table.
    fn build(cfg: &LlmConfig) -> Result<Self, SetupError>;
}

macro_rules! stt_dispatch {
    ($($(#[$vm:meta])* $variant:ident = $kind:literal { $($defaults:tt)* } => $($imp:ident)::+),+ $(,)?) => {
        /// The provider of one `[stt.NAME]` table, by its kind.
        pub(crate) fn build_stt(cfg: &SttConfig) -> Result<Arc<dyn SttProvider>, SetupError> {
            Ok(match cfg.kind {
                $(SttKind::$variant => Arc::new(<super::$($imp)::+ as SttKindImpl>::build(cfg)?)),+
            })
        }

        /// `patterd doctor`'s credential request for one `[stt.NAME]` table, by its kind
        /// (`None`: the kind has no credentials to check).
        pub(crate) fn stt_credential_check(
            cfg: &SttConfig,
            client: &reqwest::Client,
        ) -> Option<reqwest::RequestBuilder> {
            match cfg.kind {
                $(SttKind::$variant => <super::$($imp)::+ as SttKindImpl>::credential_check(cfg, client)),+
            }
        }
    };
}

macro_rules! tts_dispatch {
    ($($(#[$vm:meta])* $variant:ident = $kind:literal { $($defaults:tt)* } => $($imp:ident)::+),+ $(,)?) => {
        /// The provider of one `[tts.NAME]` table, by its kind.
        pub(crate) fn build_tts(cfg: &TtsConfig) -> Result<Arc<dyn TtsProvider>, SetupError> {
            Ok(match cfg.kind {
                $(TtsKind::$variant => Arc::new(<super::$($imp)::+ as TtsKindImpl>::build(cfg)?)),+
            })
        }

        /// `patterd doctor`'s credential request for one `[tts.NAME]` table, by its kind (`None`:
        /// a local engine, nothing to check).
        pub(crate) fn tts_credential_check(
            cfg: &TtsConfig,
            client: &reqwest::Client,
        ) -> Option<reqwest::RequestBuilder> {
            match cfg.kind {
                $(TtsKind::$variant => <super::$($imp)::+ as TtsKindImpl>::credential_check(cfg, client)),+
            }
        }
    };
}

macro_rules! llm_dispatch {
    ($($(#[$vm:meta])* $variant:ident = $kind:literal { $($defaults:tt)* } => $($imp:ident)::+),+ $(,)?) => {
        /// The provider of one `[llm.NAME]` table, by its kind.
        pub(crate) fn build_llm(cfg: &LlmConfig) -> Result<Arc<dyn LlmProvider>, SetupError> {
            Ok(match cfg.kind {
                $(LlmKind::$variant => Arc::new(<super::$($imp)::+ as LlmKindImpl>::build(cfg)?)),+
            })
        }
    };
}

stt_kinds!(stt_dispatch);
tts_kinds!(tts_dispatch);
llm_kinds!(llm_dispatch);

/// A provider's REST root for a base URL that may be a WebSocket one (`wss://` → `https://`).
pub(crate) fn http_base(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if let Some(rest) = base.strip_prefix("wss://") {
        format!("https://{rest}")
    } else if let Some(rest) = base.strip_prefix("ws://") {
        format!("http://{rest}")
    } else {
        base.to_string()
    }
}

/// The OpenAI-style key check, `GET {base}/models` with the bearer key (OpenAI's REST root is
/// also its Realtime base, `…/v1`, over HTTPS).
pub(crate) fn models_check(
    base: &str,
    key: &crate::util::secret::Secret,
    client: &reqwest::Client,
) -> reqwest::RequestBuilder {
    client
        .get(format!("{}/models", http_base(base)))
        .bearer_auth(key.expose())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(r: reqwest::RequestBuilder) -> String {
        r.build().expect("request").url().to_string()
    }

    #[test]
    fn every_kind_has_a_credential_request_at_its_rest_root() {
        crate::util::init_tls();
        let client = reqwest::Client::new();
        for &kind in SttKind::ALL {
            let mut c: SttConfig =
                toml::from_str(&format!("kind = \"{}\"", kind.as_str())).expect("config");
            c.api_key = crate::util::secret::Secret::new("k");
            let Some(req) = stt_credential_check(&c, &client) else {
                assert_eq!(
                    kind,
                    SttKind::Whisper,
                    "only the in-process kind has no check"
                );
                continue;
            };
            let u = url(req);
            assert!(u.starts_with("http"), "{kind:?}: {u}");
        }
        for &kind in TtsKind::ALL {
            let mut c: TtsConfig =
                toml::from_str(&format!("kind = \"{}\"", kind.as_str())).expect("config");
            c.fill_kind_defaults();
            match tts_credential_check(&c, &client) {
                Some(r) => {
                    let u = url(r);
                    assert!(u.starts_with("http"), "{kind:?}: {u}");
                }
                None => assert!(kind.is_local() && !kind.needs_key(), "{kind:?}"),
            }
        }
        let mut c: SttConfig = toml::from_str("kind = \"assemblyai\"").expect("config");
        assert_eq!(
            url(stt_credential_check(&c, &client).expect("a check")),
            "https://api.assemblyai.com/v2/transcript?limit=1"
        );
        c.base_url = "wss://streaming.eu.assemblyai.com".into();
        assert_eq!(
            url(stt_credential_check(&c, &client).expect("a check")),
            "https://api.eu.assemblyai.com/v2/transcript?limit=1"
        );
        let c: SttConfig = toml::from_str("kind = \"deepgram_flux\"").expect("config");
        assert_eq!(
            url(stt_credential_check(&c, &client).expect("a check")),
            "https://api.deepgram.com/v1/projects"
        );
    }
}
