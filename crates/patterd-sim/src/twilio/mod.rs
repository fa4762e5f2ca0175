//! The Twilio simulator: plays Twilio's side of a call against a running patterd. It signs and
//! posts voice webhooks ([`SimTwilio`]), reads the TwiML answer ([`parse_twiml`]), opens the
//! Media Streams socket and streams caller audio in real time while modelling Twilio's playback
//! buffer and checking every frame patterd sends ([`SimCall`]), and fakes the REST API
//! ([`FakeTwilioRest`]). It is deliberately as strict as the real Twilio.

pub mod call;
pub mod rest;
pub mod xml;

pub use call::{
    CloseInfo, ClosedBy, SimCall, SimCallConfig, SimError, SimState, TimelineEntry, TimelineEvent,
    Utterance,
};
pub use rest::{FakeTwilioRest, RecordedRequest};
pub use xml::{TwimlAnswer, XmlElement, parse_twiml, parse_xml};

use patterd::carrier::twilio::{SignatureAlgorithm, compute_signature, public_request_url};

/// Signs a request as Twilio does (HMAC-SHA1, auth token): the `X-Twilio-Signature` value.
pub fn sign_request(auth_token: &str, url: &str, params: &[(String, String)]) -> String {
    compute_signature(auth_token, url, params, SignatureAlgorithm::HmacSha1)
}

/// A Twilio-style id: `prefix` + 32 random lowercase hex digits (`CA…`, `MZ…`, `AC…`).
pub fn new_sid(prefix: &str) -> String {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        // Fall back to the clock; uniqueness is all a simulator needs.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b = t.to_le_bytes();
    }
    format!("{prefix}{}", hex::encode(b))
}

/// The form fields Twilio posts for a new inbound call.
pub fn voice_webhook_params(
    account_sid: &str,
    call_sid: &str,
    from: &str,
    to: &str,
) -> Vec<(String, String)> {
    [
        ("AccountSid", account_sid),
        ("ApiVersion", "2010-04-01"),
        ("CallSid", call_sid),
        ("CallStatus", "ringing"),
        ("Called", to),
        ("CalledCountry", "US"),
        ("Caller", from),
        ("CallerCountry", "US"),
        ("Direction", "inbound"),
        ("From", from),
        ("FromCountry", "US"),
        ("To", to),
        ("ToCountry", "US"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The form fields Twilio posts to a number's messaging webhook for an inbound SMS.
pub fn sms_webhook_params(
    account_sid: &str,
    message_sid: &str,
    from: &str,
    to: &str,
    body: &str,
) -> Vec<(String, String)> {
    [
        ("ToCountry", "US"),
        ("ToState", "CA"),
        ("SmsMessageSid", message_sid),
        ("NumMedia", "0"),
        ("ToCity", ""),
        ("FromZip", ""),
        ("SmsSid", message_sid),
        ("FromState", "CA"),
        ("SmsStatus", "received"),
        ("FromCity", ""),
        ("Body", body),
        ("FromCountry", "US"),
        ("To", to),
        ("ToZip", ""),
        ("NumSegments", "1"),
        ("MessageSid", message_sid),
        ("AccountSid", account_sid),
        ("From", from),
        ("ApiVersion", "2010-04-01"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// What patterd answered to a webhook.
#[derive(Debug, Clone)]
pub struct WebhookResponse {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: String,
}

impl WebhookResponse {
    /// Reads status, `Content-Type` and body of patterd's answer (every carrier simulator).
    pub async fn read(resp: reqwest::Response) -> Result<Self, reqwest::Error> {
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp.text().await?;
        Ok(Self {
            status,
            content_type,
            body,
        })
    }
}

/// The public URL a carrier signs for `path` (which may carry a query) under `public_url`.
pub fn signed_url(public_url: &str, path: &str) -> String {
    let (p, q) = match path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path, None),
    };
    public_request_url(public_url, p, q)
}

/// Twilio's webhook side: posts signed requests to a patterd instance.
#[derive(Debug, Clone)]
pub struct SimTwilio {
    pub client: reqwest::Client,
    /// Where patterd actually listens, e.g. `http://127.0.0.1:4321`.
    pub base_url: String,
    /// patterd's `server.public_url` (what Twilio would sign).
    pub public_url: String,
    pub account_sid: String,
    pub auth_token: String,
}

impl SimTwilio {
    pub fn new(base_url: &str, public_url: &str, account_sid: &str, auth_token: &str) -> Self {
        patterd::util::init_tls();
        Self {
            client: reqwest::Client::new(),
            base_url: base_url.trim_end_matches('/').to_string(),
            public_url: public_url.to_string(),
            account_sid: account_sid.to_string(),
            auth_token: auth_token.to_string(),
        }
    }

    /// POSTs `params` as a form to `path` (which may carry a query), signed over the public URL.
    pub async fn post_form(
        &self,
        path: &str,
        params: &[(String, String)],
    ) -> Result<WebhookResponse, reqwest::Error> {
        let sig = sign_request(
            &self.auth_token,
            &signed_url(&self.public_url, path),
            params,
        );
        self.post_form_with_signature(path, params, &sig).await
    }

    /// POSTs with a caller-chosen signature header value (for negative tests).
    pub async fn post_form_with_signature(
        &self,
        path: &str,
        params: &[(String, String)],
        signature: &str,
    ) -> Result<WebhookResponse, reqwest::Error> {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params.iter())
            .finish();
        let resp = self
            .client
            .post(format!("{}{}", self.base_url, path))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .header("X-Twilio-Signature", signature)
            .header("User-Agent", "TwilioProxy/1.1")
            .body(body)
            .send()
            .await?;
        WebhookResponse::read(resp).await
    }

    /// The path (and query) of one of patterd's public URLs, as the simulator posts to it.
    pub fn path_of(&self, public: &str) -> String {
        let base = self.public_url.trim_end_matches('/');
        let rest = public.strip_prefix(base).unwrap_or(public);
        match rest.find("://") {
            // Not under public_url: keep only the path.
            Some(i) => rest[i + 3..]
                .find('/')
                .map_or("/".to_string(), |j| rest[i + 3 + j..].to_string()),
            None => rest.to_string(),
        }
    }

    fn outbound_params(
        &self,
        created: &rest::RecordedRequest,
        status: &str,
    ) -> Vec<(String, String)> {
        let sid = created.created_sid.clone().unwrap_or_default();
        let to = created.field("To").unwrap_or_default();
        let from = created.field("From").unwrap_or_default();
        [
            ("AccountSid", self.account_sid.as_str()),
            ("ApiVersion", "2010-04-01"),
            ("CallSid", sid.as_str()),
            ("CallStatus", status),
            ("Called", to.as_str()),
            ("Caller", from.as_str()),
            ("Direction", "outbound-api"),
            ("From", from.as_str()),
            ("To", to.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// Posts a status callback for a call patterd created (to its `StatusCallback`), with
    /// extra fields such as `CallDuration` or `AnsweredBy`.
    pub async fn outbound_status(
        &self,
        created: &rest::RecordedRequest,
        status: &str,
        extra: &[(&str, &str)],
    ) -> Result<WebhookResponse, reqwest::Error> {
        let mut params = self.outbound_params(created, status);
        params.push(("CallbackSource".into(), "call-progress-events".into()));
        params.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let url = created.field("StatusCallback").unwrap_or_default();
        self.post_form(&self.path_of(&url), &params).await
    }

    /// Answers a call patterd created, as Twilio does: `initiated` and `ringing` status
    /// callbacks, then the answer webhook (`Url`, with `AnsweredBy` when machine detection was
    /// asked for) — or, for inline `Twiml`, that document. Returns the TwiML to run.
    pub async fn answer_outbound(
        &self,
        created: &rest::RecordedRequest,
        answered_by: Option<&str>,
    ) -> Result<WebhookResponse, reqwest::Error> {
        if created.field("StatusCallback").is_some() {
            self.outbound_status(created, "initiated", &[]).await?;
            self.outbound_status(created, "ringing", &[]).await?;
        }
        if let Some(twiml) = created.field("Twiml") {
            return Ok(WebhookResponse {
                status: 200,
                content_type: Some("text/xml".into()),
                body: twiml,
            });
        }
        let mut params = self.outbound_params(created, "in-progress");
        if created.field("MachineDetection").is_some() {
            params.push((
                "AnsweredBy".into(),
                answered_by.unwrap_or("human").to_string(),
            ));
        }
        let url = created.field("Url").unwrap_or_default();
        self.post_form(&self.path_of(&url), &params).await
    }

    /// An inbound text message: posts the messaging webhook (`/twilio/sms`) with a fresh
    /// `MessageSid`. Returns the `MessageSid` and patterd's answer.
    pub async fn incoming_sms(
        &self,
        from: &str,
        to: &str,
        body: &str,
    ) -> Result<(String, WebhookResponse), reqwest::Error> {
        let sid = new_sid("SM");
        let params = sms_webhook_params(&self.account_sid, &sid, from, to, body);
        let resp = self.post_form("/twilio/sms", &params).await?;
        Ok((sid, resp))
    }

    /// A new inbound call: posts the voice webhook to `path` with a fresh `CallSid`.
    /// Returns the `CallSid` and patterd's answer.
    pub async fn incoming_call(
        &self,
        path: &str,
        from: &str,
        to: &str,
    ) -> Result<(String, WebhookResponse), reqwest::Error> {
        let call_sid = new_sid("CA");
        let params = voice_webhook_params(&self.account_sid, &call_sid, from, to);
        let resp = self.post_form(path, &params).await?;
        Ok((call_sid, resp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sids_look_like_twilio() {
        let s = new_sid("MZ");
        assert_eq!(s.len(), 34);
        assert!(s.starts_with("MZ"));
        assert_ne!(s, new_sid("MZ"));
    }

    #[test]
    fn signed_params_validate() {
        let params = voice_webhook_params("AC1", "CA1", "+15550001111", "+15550002222");
        let url = "https://gw.example.com/twilio/voice";
        let sig = sign_request("tok", url, &params);
        assert!(patterd::carrier::twilio::validate_signature(
            "tok", url, &params, &sig, None
        ));
    }
}
