//! Telnyx number administration: the credential check
//! `GET /v2/balance`; a number found by `filter[phone_number]` (digits only, exact match on
//! the result) routes to the Call Control application in its `connection_id`, whose
//! `webhook_event_url` is where calls arrive. Wiring points the number at the account's own
//! application (`connection_id` in `[carriers.NAME]`, the one placing outbound calls) and sets
//! that application's `webhook_event_url` (with its `application_name`, which Telnyx requires
//! in every update); unwire restores the number's `connection_id`, and once no other number
//! wired by patterd uses the application, its name, URL and `webhook_api_version` as they were
//! (kept once per application). The other numbers on the application are those listed with
//! `filter[connection_id]`.

use serde_json::{Value, json};

use super::rest::TelnyxRest;
use crate::carrier::CarrierError;
use crate::carrier::admin::{
    AdminMethod, AdminRequest, NumberAdmin, SharedApp, Wiring, bad_record, send_with, str_field,
};
use crate::carrier::registry::BoxFuture;
use crate::carrier::rest_client::path_safe;
use crate::carrier::webhook::public_request_url;

const CARRIER: &str = "Telnyx";

/// Numbers asked for per page, and the most listed for the check of a shared application.
const PAGE_SIZE: u32 = 250;
const MAX_LISTED: u32 = 2500;

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

    /// `{id, application_name, webhook_event_url, webhook_api_version}` of application `id`.
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
            "webhook_api_version": str_field(&d, "webhook_api_version"),
        }))
    }

    /// The numbers on application `id` (every page of `filter[connection_id]`, at most
    /// [`MAX_LISTED`] numbers).
    async fn numbers_on(&self, id: &str) -> Result<Vec<String>, CarrierError> {
        if !path_safe(id) {
            return Err(bad_record(CARRIER));
        }
        let mut out = Vec::new();
        for page in 1..=MAX_LISTED / PAGE_SIZE {
            let url = format!(
                "{}/v2/phone_numbers?filter%5Bconnection_id%5D={id}&page%5Bsize%5D={PAGE_SIZE}\
                 &page%5Bnumber%5D={page}",
                self.rest.base
            );
            let v = self.get(url).await?;
            let data = v.get("data").and_then(Value::as_array).cloned().unwrap_or_default();
            out.extend(
                data.iter()
                    .filter(|n| str_field(n, "connection_id") == id)
                    .map(|n| str_field(n, "phone_number"))
                    .filter(|n| !n.is_empty()),
            );
            let pages = v
                .pointer("/meta/total_pages")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            if data.is_empty() || u64::from(page) >= pages {
                break;
            }
        }
        Ok(out)
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
        let shared = (!ours.is_null()).then(|| SharedApp {
            id: str_field(&ours, "id"),
            voice_url: str_field(&ours, "webhook_event_url"),
            saved: ours.clone(),
        });
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
            app: shared,
        })
    }
}

/// The update of application `app` to `webhook` with API version `version` (left as it is
/// when empty: a record saved before the version was kept).
fn app_update(url: String, app: &Value, webhook: &str, version: &str) -> AdminRequest {
    let mut body = json!({
        "application_name": str_field(app, "application_name"),
        "webhook_event_url": webhook,
    });
    if !version.is_empty() {
        body["webhook_api_version"] = json!(version);
    }
    AdminRequest::json(AdminMethod::Patch, url, &body)
}

/// The restore of application `ours` as saved (name, URL, API version).
fn app_restore(this: &TelnyxNumbers, ours: &Value) -> Result<AdminRequest, CarrierError> {
    let app_id = str_field(ours, "id");
    if !path_safe(&app_id) {
        return Err(bad_record(CARRIER));
    }
    Ok(app_update(
        this.app_url(&app_id),
        ours,
        &str_field(ours, "webhook_event_url"),
        &str_field(ours, "webhook_api_version"),
    ))
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
                "2",
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
        // A record from before applications were kept apart restores its application here.
        if previous.app.is_none()
            && let Some(ours) = s.get("ours").filter(|o| !o.is_null())
        {
            plan.push(app_restore(self, ours)?);
        }
        Ok(plan)
    }

    fn app_numbers(&self, app: &SharedApp) -> BoxFuture<Result<Vec<String>, CarrierError>> {
        let this = TelnyxNumbers {
            rest: self.rest.clone(),
            connection_id: self.connection_id.clone(),
        };
        let id = app.id.clone();
        Box::pin(async move { this.numbers_on(&id).await })
    }

    fn restore_app_plan(&self, app: &SharedApp) -> Result<Vec<AdminRequest>, CarrierError> {
        Ok(vec![app_restore(self, &app.saved)?])
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
