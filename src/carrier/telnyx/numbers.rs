//! Telnyx number administration: the credential check
//! `GET /v2/balance`; a number found by `filter[phone_number]` (digits only, exact match on
//! the result) routes to the Call Control application in its `connection_id`, whose
//! `webhook_event_url` is where calls arrive. Wiring points the number at the account's own
//! application (`connection_id` in `[carriers.NAME]`, the one placing outbound calls) and sets
//! that application's `webhook_event_url` (with its `application_name`, which Telnyx requires
//! in every update); unwire restores the number's `connection_id` and the application's name
//! and URL as they were.

use serde_json::{Value, json};

use super::rest::TelnyxRest;
use crate::carrier::CarrierError;
use crate::carrier::admin::{
    AdminMethod, AdminRequest, NumberAdmin, Wiring, bad_record, send_with, str_field,
};
use crate::carrier::registry::BoxFuture;
use crate::carrier::rest_client::path_safe;
use crate::carrier::webhook::public_request_url;

const CARRIER: &str = "Telnyx";

/// [`NumberAdmin`] for one Telnyx account.
pub(crate) struct TelnyxNumbers {
    pub rest: TelnyxRest,
    /// The account's own Call Control application (`connection_id`), possibly empty.
    pub connection_id: String,
}

impl TelnyxNumbers {
    fn app_url(&self, id: &str) -> String {
        format!("{}/v2/call_control_applications/{id}", self.rest.base)
    }

    fn number_url(&self, id: &str) -> String {
        format!("{}/v2/phone_numbers/{id}", self.rest.base)
    }

    async fn get(&self, url: String) -> Result<Value, CarrierError> {
        send_with(
            &self.rest.client,
            CARRIER,
            &self.rest.base,
            &self.rest.authorization(),
            &AdminRequest::get(url),
        )
        .await
    }

    /// `{id, application_name, webhook_event_url}` of application `id`.
    async fn app(&self, id: &str) -> Result<Value, CarrierError> {
        if !path_safe(id) {
            return Err(bad_record(CARRIER));
        }
        let v = self.get(self.app_url(id)).await?;
        let d = v.get("data").cloned().unwrap_or(Value::Null);
        Ok(json!({
            "id": id,
            "application_name": str_field(&d, "application_name"),
            "webhook_event_url": str_field(&d, "webhook_event_url"),
        }))
    }

    async fn read(&self, number: String) -> Result<Wiring, CarrierError> {
        let digits: String = number.chars().filter(char::is_ascii_digit).collect();
        let url = format!(
            "{}/v2/phone_numbers?filter%5Bphone_number%5D={digits}&page%5Bsize%5D=20",
            self.rest.base
        );
        let v = self.get(url).await?;
        let found = v
            .get("data")
            .and_then(Value::as_array)
            .and_then(|l| {
                l.iter()
                    .find(|n| n.get("phone_number").and_then(Value::as_str) == Some(&number))
            })
            .cloned()
            .ok_or_else(|| CarrierError::NotFound {
                carrier: CARRIER,
                what: format!(
                    "the number {} on this account",
                    crate::security::mask_number(&number)
                ),
            })?;
        let id = str_field(&found, "id");
        if !path_safe(&id) {
            return Err(bad_record(CARRIER));
        }
        let connection = str_field(&found, "connection_id");
        let app = if connection.is_empty() {
            Value::Null
        } else {
            self.app(&connection).await?
        };
        let ours = if self.connection_id.is_empty() {
            Value::Null
        } else if self.connection_id == connection {
            app.clone()
        } else {
            self.app(&self.connection_id).await?
        };
        let voice = str_field(&app, "webhook_event_url");
        let (voice_url, describe) = if connection.is_empty() {
            (None, "no Call Control application".to_string())
        } else if voice.is_empty() {
            (None, format!("application {connection} without a webhook URL"))
        } else {
            (
                Some(voice.clone()),
                format!("application {connection} → {voice}"),
            )
        };
        Ok(Wiring {
            number,
            voice_url,
            describe,
            saved: json!({
                "id": id,
                "connection_id": connection,
                "app": app,
                "ours": ours,
            }),
        })
    }
}

fn app_update(url: String, app: &Value, webhook: &str) -> AdminRequest {
    AdminRequest::json(
        AdminMethod::Patch,
        url,
        &json!({
            "application_name": str_field(app, "application_name"),
            "webhook_event_url": webhook,
            "webhook_api_version": "2",
        }),
    )
}

impl NumberAdmin for TelnyxNumbers {
    fn check_credentials(&self) -> BoxFuture<Result<String, CarrierError>> {
        let url = format!("{}/v2/balance", self.rest.base);
        let rest = self.rest.clone();
        Box::pin(async move {
            let v = send_with(
                &rest.client,
                CARRIER,
                &rest.base,
                &rest.authorization(),
                &AdminRequest::get(url),
            )
            .await?;
            let d = v.get("data").cloned().unwrap_or(Value::Null);
            Ok(format!(
                "balance {} {}",
                str_field(&d, "balance"),
                str_field(&d, "currency")
            ))
        })
    }

    fn inbound_url(&self, public_url: &str) -> String {
        public_request_url(public_url, "/telnyx/webhook", None)
    }

    fn read_wiring(&self, number: &str) -> BoxFuture<Result<Wiring, CarrierError>> {
        let this = TelnyxNumbers {
            rest: self.rest.clone(),
            connection_id: self.connection_id.clone(),
        };
        let number = number.to_string();
        Box::pin(async move { this.read(number).await })
    }

    fn wire_plan(
        &self,
        current: &Wiring,
        public_url: &str,
    ) -> Result<Vec<AdminRequest>, CarrierError> {
        if self.connection_id.is_empty() {
            return Err(CarrierError::Config {
                carrier: CARRIER,
                message: "no connection_id: set it to the id of the Call Control application \
                          patterd should own, then wire again"
                    .into(),
            });
        }
        let s = &current.saved;
        let id = str_field(s, "id");
        let ours = s.get("ours").filter(|o| !o.is_null()).ok_or_else(|| bad_record(CARRIER))?;
        if !path_safe(&id) || str_field(ours, "id") != self.connection_id {
            return Err(bad_record(CARRIER));
        }
        Ok(vec![
            app_update(
                self.app_url(&self.connection_id),
                ours,
                &self.inbound_url(public_url),
            ),
            AdminRequest::json(
                AdminMethod::Patch,
                self.number_url(&id),
                &json!({"connection_id": self.connection_id}),
            ),
        ])
    }

    fn restore_plan(&self, previous: &Wiring) -> Result<Vec<AdminRequest>, CarrierError> {
        let s = &previous.saved;
        let id = str_field(s, "id");
        if !path_safe(&id) {
            return Err(bad_record(CARRIER));
        }
        let mut plan = vec![AdminRequest::json(
            AdminMethod::Patch,
            self.number_url(&id),
            &json!({"connection_id": str_field(s, "connection_id")}),
        )];
        if let Some(ours) = s.get("ours").filter(|o| !o.is_null()) {
            let app_id = str_field(ours, "id");
            if !path_safe(&app_id) {
                return Err(bad_record(CARRIER));
            }
            plan.push(app_update(
                self.app_url(&app_id),
                ours,
                &str_field(ours, "webhook_event_url"),
            ));
        }
        Ok(plan)
    }

    fn send(&self, req: AdminRequest) -> BoxFuture<Result<Value, CarrierError>> {
        let rest = self.rest.clone();
        Box::pin(async move {
            send_with(
                &rest.client,
                CARRIER,
                &rest.base,
                &rest.authorization(),
                &req,
            )
            .await
        })
    }
}

/// The number administration of a `kind = "telnyx"` account.
pub fn admin(cfg: &super::Config) -> Result<Box<dyn NumberAdmin>, CarrierError> {
    Ok(Box::new(TelnyxNumbers {
        rest: TelnyxRest::from_config(cfg)?,
        connection_id: cfg.connection_id.trim().to_string(),
    }))
}
