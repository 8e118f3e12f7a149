//! Webhook deliveries: every second each enabled webhook gets the events of its team's sandboxes it
//! subscribed to that came after the last one it was handed, oldest first, one at a time, as E2B
//! sends them: a POST of the event's JSON with `e2b-webhook-id`, `e2b-delivery-id`,
//! `e2b-signature-version: v1` and, when the webhook has a secret, `e2b-signature` (the unpadded
//! base64 SHA-256 of the secret followed by the body). A delivery that times out or answers other
//! than 2xx is tried three more times, `webhook_retry_interval` apart, then given up (logged and
//! counted). Where each webhook stands is stored, so a restart neither repeats nor skips.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::api::events::to_api;
use crate::lifecycle::Lifecycle;
use crate::store::{EventQuery, WebhookRecord};

/// Retries after the first attempt.
const RETRIES: u32 = 3;
/// How long one attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often new events are looked for.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Events one webhook is handed per look.
const BATCH: u64 = 100;

/// The `e2b-signature` of `body` under `secret`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(secret.as_bytes());
    hash.update(body);
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(hash.finalize())
}

/// Delivers until `shutdown` turns true.
pub async fn run(lifecycle: Arc<Lifecycle>, shutdown: watch::Receiver<bool>) {
    // HTTPS to the webhooks' hosts: rustls is built without a default crypto provider here.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = match reqwest::Client::builder().timeout(ATTEMPT_TIMEOUT).build() {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "webhook deliveries are off: no HTTP client");
            return;
        }
    };
    // Webhooks with a delivery task running: one task per webhook keeps its events in order.
    let busy: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut ticker = crate::lifecycle::Ticker::new(POLL_INTERVAL, shutdown);
    while ticker.next().await {
        // With servers sharing the store, the leading one delivers (each event once).
        if !lifecycle.leads() {
            continue;
        }
        let webhooks = match lifecycle.store().list_webhooks().await {
            Ok(webhooks) => webhooks,
            Err(error) => {
                tracing::error!(%error, "cannot read the webhooks");
                continue;
            }
        };
        for webhook in webhooks.into_iter().filter(|w| w.enabled) {
            if !busy
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(webhook.id.clone())
            {
                continue;
            }
            let lifecycle = Arc::clone(&lifecycle);
            let client = client.clone();
            let busy = Arc::clone(&busy);
            tokio::spawn(async move {
                let id = webhook.id.clone();
                deliver_backlog(&lifecycle, &client, webhook).await;
                busy.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            });
        }
    }
}

async fn deliver_backlog(lifecycle: &Lifecycle, client: &reqwest::Client, webhook: WebhookRecord) {
    let store = lifecycle.store();
    let query = EventQuery {
        team_id: webhook.team_id.clone(),
        sandbox_id: None,
        types: webhook.events.clone(),
        after_seq: Some(webhook.delivered_seq),
        offset: 0,
        limit: BATCH,
        ascending: true,
    };
    let events = match store.lifecycle_events(&query).await {
        Ok(events) => events,
        Err(error) => {
            tracing::error!(webhook = %webhook.id, %error, "cannot read events to deliver");
            return;
        }
    };
    for event in events {
        let seq = event.event.seq;
        let body = match serde_json::to_vec(&to_api(event)) {
            Ok(body) => body,
            Err(error) => {
                tracing::error!(webhook = %webhook.id, %error, "cannot encode an event");
                continue;
            }
        };
        let delivered = deliver(lifecycle, client, &webhook, &body).await;
        lifecycle
            .metrics()
            .webhook_delivery(if delivered { "delivered" } else { "failed" });
        if let Err(error) = store.set_webhook_delivered(&webhook.id, seq).await {
            tracing::error!(webhook = %webhook.id, %error, "cannot record a delivery");
            return;
        }
    }
}

/// One event to one webhook, with its retries; whether it got a 2xx.
async fn deliver(
    lifecycle: &Lifecycle,
    client: &reqwest::Client,
    webhook: &WebhookRecord,
    body: &[u8],
) -> bool {
    let retry = lifecycle.config().webhook_retry_interval;
    for attempt in 0..=RETRIES {
        if attempt > 0 {
            tokio::time::sleep(retry).await;
        }
        let mut request = client
            .post(&webhook.url)
            .header("content-type", "application/json")
            .header("e2b-webhook-id", &webhook.id)
            .header("e2b-delivery-id", uuid::Uuid::new_v4().to_string())
            .header("e2b-signature-version", "v1")
            .body(body.to_vec());
        if let Some(secret) = &webhook.secret {
            request = request.header("e2b-signature", signature(secret, body));
        }
        match request.send().await {
            Ok(response) if response.status().is_success() => return true,
            Ok(response) => tracing::warn!(
                webhook = %webhook.id, attempt, status = %response.status(),
                "webhook delivery refused"
            ),
            Err(error) => {
                tracing::warn!(webhook = %webhook.id, attempt, %error, "webhook delivery failed")
            }
        }
    }
    tracing::error!(webhook = %webhook.id, url = %webhook.url, "webhook delivery given up after {RETRIES} retries");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_unpadded_base64_sha256_of_secret_then_body() {
        // printf 's3cret{}' | sha256sum
        let expected = base64::engine::general_purpose::STANDARD_NO_PAD.encode(
            hex::decode("30f655aafab9c6138e3976ed64bcae2c3999b383f938fcd1ad46632549b57edd")
                .unwrap(),
        );
        assert_eq!(signature("s3cret", b"{}"), expected);
        assert!(!expected.ends_with('='));
        assert_ne!(signature("other", b"{}"), expected);
    }
}
