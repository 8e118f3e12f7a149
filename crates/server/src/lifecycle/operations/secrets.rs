//! Stored secrets and their use by sandboxes. A sandbox's record keeps `${e2b.secrets.<name>}`
//! placeholders as given; they are replaced by the current values only on their way to the agent
//! (`envVars`, at every `/init`) and to the egress proxy (`network.rules` header values, whenever a
//! sandbox's rules are installed: create, resume, fork, a network update, a restart's reconcile, and
//! an update of a secret they use). Every message here names secrets, never their values.

use std::collections::{BTreeMap, BTreeSet};

use warren_runtime::network::egress::EgressRules;

use super::network::network_spec;
use super::{Lifecycle, LifecycleError};
use crate::lifecycle::now_millis;
use crate::lifecycle::state::SandboxState;
use crate::secrets::{self, placeholders};
use crate::store::{Millis, SandboxFilter, SandboxRecord, SecretRecord};

/// What an update of a secret changes: a new value (a new version), new metadata, or both.
#[derive(Debug, Clone, PartialEq)]
pub enum SecretChange {
    Value(String),
    Metadata(BTreeMap<String, String>),
    Both(String, BTreeMap<String, String>),
}

/// Where placeholders were found: (field for error messages, text).
fn placeholder_fields<'a>(
    env_vars: &'a BTreeMap<String, String>,
    egress: &'a EgressRules,
) -> Vec<(String, &'a str)> {
    let mut fields: Vec<(String, &str)> = env_vars
        .iter()
        .map(|(key, value)| (format!("envVars.{key}"), value.as_str()))
        .collect();
    for rule in &egress.header_rules {
        for (header, value) in &rule.headers {
            fields.push((
                format!("network.rules.{}.transform.headers.{header}", rule.pattern),
                value.as_str(),
            ));
        }
    }
    fields
}

/// The secret names `egress`'s header values use.
fn names_in_rules(egress: &EgressRules) -> BTreeSet<String> {
    placeholder_fields(&BTreeMap::new(), egress)
        .into_iter()
        .flat_map(|(_, text)| placeholders::names(text).unwrap_or_default())
        .collect()
}

impl Lifecycle {
    /// `POST /secrets`: stores version 1 of a new secret, sealed with the operator's key.
    pub async fn create_secret(
        &self,
        team_id: &str,
        name: &str,
        value: &str,
        metadata: BTreeMap<String, String>,
    ) -> Result<SecretRecord, LifecycleError> {
        let name = secrets::canonical_name(name).map_err(LifecycleError::BadRequest)?;
        secrets::check_value(value).map_err(LifecycleError::BadRequest)?;
        secrets::check_metadata(&metadata).map_err(LifecycleError::BadRequest)?;
        let id = secrets::new_secret_id();
        let sealed = self.keyring.key()?.seal(&id, 1, value)?;
        let now = now_millis();
        let record = SecretRecord {
            id,
            team_id: team_id.to_string(),
            name,
            version: 1,
            sealed,
            metadata,
            created_at: now,
            updated_at: now,
        };
        if !self.store.insert_secret(&record).await? {
            return Err(LifecycleError::Conflict(format!(
                "a secret named '{}' already exists",
                record.name
            )));
        }
        Ok(record)
    }

    /// Team `team_id`'s secret by id or name.
    pub async fn secret(
        &self,
        team_id: &str,
        id_or_name: &str,
    ) -> Result<Option<SecretRecord>, LifecycleError> {
        Ok(self.store.get_secret(team_id, id_or_name).await?)
    }

    pub async fn list_secrets(
        &self,
        team_id: &str,
        after: Option<(Millis, String)>,
        limit: u32,
    ) -> Result<Vec<SecretRecord>, LifecycleError> {
        Ok(self.store.list_secrets(team_id, after, limit).await?)
    }

    /// `POST /secrets/{id}`: a new value becomes the next version (and reaches the egress proxy
    /// rules of the team's running sandboxes that use it); metadata replaces the old. `None` when
    /// the team has no such secret.
    pub async fn update_secret(
        &self,
        team_id: &str,
        id_or_name: &str,
        change: SecretChange,
    ) -> Result<Option<SecretRecord>, LifecycleError> {
        let (value, metadata) = match change {
            SecretChange::Value(value) => (Some(value), None),
            SecretChange::Metadata(metadata) => (None, Some(metadata)),
            SecretChange::Both(value, metadata) => (Some(value), Some(metadata)),
        };
        if let Some(value) = &value {
            secrets::check_value(value).map_err(LifecycleError::BadRequest)?;
        }
        if let Some(metadata) = &metadata {
            secrets::check_metadata(metadata).map_err(LifecycleError::BadRequest)?;
        }
        let Some(old) = self.store.get_secret(team_id, id_or_name).await? else {
            return Ok(None);
        };
        let mut new = old.clone();
        new.updated_at = now_millis();
        if let Some(metadata) = metadata {
            new.metadata = metadata;
        }
        if let Some(value) = &value {
            new.version = old.version + 1;
            new.sealed = self.keyring.key()?.seal(&new.id, new.version, value)?;
        }
        if !self.store.update_secret(&new, old.version).await? {
            return Err(LifecycleError::Conflict(format!(
                "secret '{}' changed meanwhile; try again",
                old.name
            )));
        }
        if value.is_some() {
            self.refresh_rules_using(team_id, &new.name).await;
        }
        Ok(Some(new))
    }

    /// `DELETE /secrets/{id}`: false when the team has no such secret. Running sandboxes keep the
    /// values their rules and processes already have; placeholders naming it fail from now on.
    pub async fn delete_secret(
        &self,
        team_id: &str,
        id_or_name: &str,
    ) -> Result<bool, LifecycleError> {
        let Some(secret) = self.store.get_secret(team_id, id_or_name).await? else {
            return Ok(false);
        };
        Ok(self.store.delete_secret(team_id, &secret.id).await?)
    }

    /// Checks that every placeholder in a create's (or network update's) fields is well formed and
    /// names a secret of the team: a 400 naming the field and placeholder otherwise.
    pub(crate) async fn check_placeholders(
        &self,
        team_id: &str,
        env_vars: &BTreeMap<String, String>,
        egress: &EgressRules,
    ) -> Result<(), LifecycleError> {
        for (field, text) in placeholder_fields(env_vars, egress) {
            let names = placeholders::names(text)
                .map_err(|reason| LifecycleError::BadRequest(format!("{field}: {reason}")))?;
            for name in names {
                if self.store.get_secret(team_id, &name).await?.is_none() {
                    return Err(LifecycleError::BadRequest(format!(
                        "{field}: placeholder {} names no secret of this team",
                        placeholders::placeholder(&name)
                    )));
                }
            }
        }
        Ok(())
    }

    /// The current values of `names`, each opened with the operator's key.
    async fn secret_values(
        &self,
        team_id: &str,
        names: BTreeSet<String>,
    ) -> Result<BTreeMap<String, String>, LifecycleError> {
        let mut values = BTreeMap::new();
        for name in names {
            let Some(secret) = self.store.get_secret(team_id, &name).await? else {
                return Err(LifecycleError::BadRequest(format!(
                    "placeholder {} names no secret of this team (was it deleted?)",
                    placeholders::placeholder(&name)
                )));
            };
            let value = self.keyring.key()?.open(
                &secret.id,
                &secret.name,
                secret.version,
                &secret.sealed,
            )?;
            values.insert(name, value);
        }
        Ok(values)
    }

    /// `text` with its placeholders replaced by their values.
    async fn resolve_text(
        &self,
        team_id: &str,
        field: &str,
        text: &str,
    ) -> Result<String, LifecycleError> {
        let names = placeholders::names(text)
            .map_err(|reason| LifecycleError::BadRequest(format!("{field}: {reason}")))?;
        if names.is_empty() {
            return Ok(text.to_string());
        }
        let values = self.secret_values(team_id, names).await?;
        placeholders::substitute(text, &values).ok_or_else(|| {
            LifecycleError::BadRequest(format!("{field}: a placeholder could not be resolved"))
        })
    }

    /// The environment the agent gets: `record.env_vars` with the secrets put in.
    pub(crate) async fn resolved_env(
        &self,
        record: &SandboxRecord,
    ) -> Result<BTreeMap<String, String>, LifecycleError> {
        let mut env = BTreeMap::new();
        for (key, value) in &record.env_vars {
            let field = format!("envVars.{key}");
            let resolved = self.resolve_text(&record.team_id, &field, value).await?;
            env.insert(key.clone(), resolved);
        }
        Ok(env)
    }

    /// The runtime's network settings of `record` with the secrets put into its header values: what
    /// the egress proxy is given. A value with a line break is refused (it would split the header).
    pub(crate) async fn resolved_network_spec(
        &self,
        record: &SandboxRecord,
    ) -> Result<warren_runtime::NetworkSpec, LifecycleError> {
        let mut resolved = record.clone();
        for rule in &mut resolved.egress.header_rules {
            for (header, value) in &mut rule.headers {
                if !value.contains(placeholders::OPEN) {
                    continue;
                }
                let field = format!("network.rules.{}.transform.headers.{header}", rule.pattern);
                let text = self.resolve_text(&record.team_id, &field, value).await?;
                if text.contains(['\r', '\n']) {
                    return Err(LifecycleError::BadRequest(format!(
                        "{field}: a secret it uses holds a line break, which a header cannot carry"
                    )));
                }
                *value = text;
            }
        }
        Ok(network_spec(&resolved))
    }

    /// Gives the egress proxy fresh values for the team's running sandboxes whose header rules use
    /// secret `name` (after its value changed), so new requests carry the new value.
    async fn refresh_rules_using(&self, team_id: &str, name: &str) {
        let running = match self
            .store
            .list_sandboxes(&SandboxFilter {
                team_id: Some(team_id.to_string()),
                states: vec![SandboxState::Running],
                ..SandboxFilter::default()
            })
            .await
        {
            Ok(running) => running,
            Err(error) => {
                tracing::warn!(secret = %name, %error, "cannot list the sandboxes that use a secret");
                return;
            }
        };
        for record in running {
            if !names_in_rules(&record.egress).contains(name) {
                continue;
            }
            let lock = self.lock_for(&record.id);
            let _held = lock.lock().await;
            // Read again under the lock: it may have been paused or its rules replaced.
            match self.store.get_sandbox(&record.id).await {
                Ok(Some(current)) if current.state == SandboxState::Running => {
                    self.reinstall_network(&current).await;
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_runtime::network::egress::{HeaderRule, HostPattern};

    #[test]
    fn rules_name_the_secrets_their_header_values_use() {
        let egress = EgressRules {
            header_rules: vec![HeaderRule {
                pattern: HostPattern::Exact("api.example.com".to_string()),
                headers: vec![
                    ("Authorization".into(), "Bearer ${e2b.secrets.Key}".into()),
                    ("X-Plain".into(), "no secret".into()),
                ],
            }],
            ..EgressRules::default()
        };
        assert_eq!(
            names_in_rules(&egress).into_iter().collect::<Vec<_>>(),
            vec!["key".to_string()]
        );
        let env = BTreeMap::from([("A".to_string(), "${e2b.secrets.b}".to_string())]);
        let fields = placeholder_fields(&env, &egress);
        assert_eq!(fields[0].0, "envVars.A");
        assert_eq!(
            fields[1].0,
            "network.rules.api.example.com.transform.headers.Authorization"
        );
    }
}
