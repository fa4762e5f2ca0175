//! The carriers as a test parameter: [`Carrier`] (number, media dialect, media URL) and
//! [`Carriers`], the carrier-specific views of a [`Stack`] — place or ring a call through a
//! carrier's simulator, open its media socket, and see (or wait for) hang-ups through its REST
//! fake. Used by the carrier matrix (`tests/calls/carriers.rs`) and the outbound tests.

use std::collections::BTreeMap;

use patterd_sim::plivo::PlivoAnswer;
use patterd_sim::stream::{Dialect, SimCall, SimCallConfig};
use patterd_sim::twilio::WebhookResponse;
use patterd_sim::vonage::VonageAnswer;

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    Twilio,
    Telnyx,
    Plivo,
    Vonage,
}

/// Every carrier, in the order the matrix runs them.
pub const ALL: [Carrier; 4] = [
    Carrier::Twilio,
    Carrier::Telnyx,
    Carrier::Plivo,
    Carrier::Vonage,
];

impl Carrier {
    pub fn number(self) -> &'static str {
        match self {
            Carrier::Twilio => OUR_NUMBER,
            Carrier::Telnyx => TELNYX_NUMBER,
            Carrier::Plivo => PLIVO_NUMBER,
            Carrier::Vonage => VONAGE_NUMBER,
        }
    }

    pub fn dialect(self) -> Dialect {
        match self {
            Carrier::Twilio => Dialect::Twilio,
            Carrier::Telnyx => Dialect::Telnyx,
            Carrier::Plivo => Dialect::PlivoMulaw,
            Carrier::Vonage => Dialect::Vonage,
        }
    }

    /// The media socket URL patterd would hand out for `call_id` with `token`.
    pub fn media_url(self, call_id: &str, token: Option<&str>) -> String {
        match (self, token) {
            (Carrier::Twilio, _) => "wss://voice.example.test/twilio/media".to_string(),
            (Carrier::Telnyx, Some(t)) => format!("wss://voice.example.test/telnyx/media/{t}"),
            (Carrier::Telnyx, None) => "wss://voice.example.test/telnyx/media/".to_string(),
            (Carrier::Plivo, Some(t)) => {
                format!("wss://voice.example.test/plivo/media/{call_id}?t={t}")
            }
            (Carrier::Plivo, None) => format!("wss://voice.example.test/plivo/media/{call_id}"),
            (Carrier::Vonage, Some(t)) => {
                format!("wss://voice.example.test/vonage/media/{call_id}?t={t}")
            }
            (Carrier::Vonage, None) => format!("wss://voice.example.test/vonage/media/{call_id}"),
        }
    }
}

/// Carrier-specific views of a stack.
pub trait Carriers {
    async fn call_via(&self, c: Carrier) -> (String, SimCall);
    async fn ring_via(&self, c: Carrier, from: &str, to: &str) -> (String, WebhookResponse);
    fn rest_hang_ups(&self, c: Carrier) -> Vec<String>;
    /// Waits for `call_id` to be hung up through carrier `c`'s REST API (no polling).
    async fn wait_rest_hang_up(&self, c: Carrier, call_id: &str);
    async fn open_raw(
        &self,
        c: Carrier,
        call_id: &str,
        token: Option<&str>,
    ) -> Result<SimCall, String>;
}

impl Carriers for Stack {
    async fn call_via(&self, c: Carrier) -> (String, SimCall) {
        match c {
            Carrier::Twilio => self.call().await,
            Carrier::Telnyx => self
                .telnyx
                .place_call(&self.telnyx_rest, &self.ws_base(), CALLER, TELNYX_NUMBER)
                .await
                .expect("telnyx call"),
            Carrier::Plivo => {
                let (uuid, r) = self.ring_via(c, CALLER, PLIVO_NUMBER).await;
                assert_eq!(r.status, 200, "{r:?}");
                let answer = PlivoAnswer::parse(&r.body).expect("plivo xml");
                let sim = self
                    .plivo
                    .open_stream(&answer, &self.ws_base(), &uuid)
                    .await
                    .expect("plivo stream opens");
                (uuid, sim)
            }
            Carrier::Vonage => {
                let (uuid, r) = self.ring_via(c, CALLER, VONAGE_NUMBER).await;
                assert_eq!(r.status, 200, "{r:?}");
                let answer = VonageAnswer::parse(&r.body).expect("vonage ncco");
                let sim = self
                    .vonage
                    .open_stream(&answer, &self.ws_base(), &uuid)
                    .await
                    .expect("vonage stream opens");
                (uuid, sim)
            }
        }
    }

    async fn ring_via(&self, c: Carrier, from: &str, to: &str) -> (String, WebhookResponse) {
        match c {
            Carrier::Twilio => self.twilio.incoming_call("/twilio/voice", from, to).await,
            Carrier::Telnyx => self.telnyx.incoming_call(from, to).await,
            Carrier::Plivo => self.plivo.incoming_call(from, to).await,
            Carrier::Vonage => self.vonage.incoming_call(from, to).await,
        }
        .expect("webhook request")
    }

    fn rest_hang_ups(&self, c: Carrier) -> Vec<String> {
        match c {
            Carrier::Twilio => self.rest.hung_up(),
            Carrier::Telnyx => self.telnyx_rest.hung_up(),
            Carrier::Plivo => self.plivo_rest.hung_up(),
            Carrier::Vonage => self.vonage_rest.hung_up(),
        }
    }

    async fn wait_rest_hang_up(&self, c: Carrier, call_id: &str) {
        let hung_up = |ids: Vec<String>| ids.iter().any(|i| i == call_id);
        match c {
            Carrier::Twilio => {
                if let Err(seen) = self.rest.wait_for_hang_up(call_id, WAIT).await {
                    panic!("no REST hang-up for {call_id}: {seen:?}");
                }
            }
            Carrier::Telnyx => {
                self.telnyx_rest
                    .wait_until("REST hang-up", |r| hung_up(r.hung_up()))
                    .await;
            }
            Carrier::Plivo => {
                self.plivo_rest
                    .wait_until("REST hang-up", |r| hung_up(r.hung_up()))
                    .await;
            }
            Carrier::Vonage => {
                self.vonage_rest
                    .wait_until("REST hang-up", |r| hung_up(r.hung_up()))
                    .await;
            }
        }
    }

    async fn open_raw(
        &self,
        c: Carrier,
        call_id: &str,
        token: Option<&str>,
    ) -> Result<SimCall, String> {
        let mut params = BTreeMap::new();
        if let (Carrier::Twilio, Some(t)) = (c, token) {
            params.insert("token".to_string(), t.to_string());
        }
        let cfg =
            SimCallConfig::new(&self.ws_base(), ACCOUNT_SID, call_id).with_dialect(c.dialect());
        SimCall::connect(&c.media_url(call_id, token), &params, cfg)
            .await
            .map_err(|e| e.to_string())
    }
}
