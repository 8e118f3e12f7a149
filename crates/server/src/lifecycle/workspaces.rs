//! Workspaces: each user of a team has one sandbox of their own. [`Lifecycle::workspace_sandbox`]
//! returns it: created from the workspace's template the first time, resumed when paused, replaced
//! (and the move written to the workspace's history) when it was killed, failed or lost. Calls for
//! one user are serialised by a lock of their own, so concurrent calls never make two sandboxes.

use super::state::SandboxState;
use super::{now_millis, CreateRequest, Lifecycle, LifecycleError, ResumeOutcome};
use crate::store::{SandboxRecord, WorkspaceMove, WorkspaceRecord};

/// Template of a workspace whose first call names none.
pub const DEFAULT_WORKSPACE_TEMPLATE: &str = "base";
/// Longest user ID accepted.
const MAX_USER_ID: usize = 128;

/// What a workspace call did to hand the user their sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceAction {
    /// The user's first sandbox.
    Created,
    /// The user's sandbox was running already (its timeout is extended).
    Existing,
    /// The user's sandbox was paused and is running again.
    Resumed,
    /// The user's sandbox was gone (killed, failed or lost); a new one took its place.
    Replaced,
}

impl WorkspaceAction {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkspaceAction::Created => "created",
            WorkspaceAction::Existing => "existing",
            WorkspaceAction::Resumed => "resumed",
            WorkspaceAction::Replaced => "replaced",
        }
    }
}

/// The user's sandbox and how they got it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkspaceSandbox {
    pub workspace: WorkspaceRecord,
    pub sandbox: SandboxRecord,
    pub action: WorkspaceAction,
}

/// A workspace call: whose, and (first call only) from which template.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WorkspaceRequest {
    pub team_id: String,
    pub user_id: String,
    pub template: Option<String>,
    /// Seconds; `None` keeps the server's default.
    pub timeout: Option<i64>,
}

/// User IDs are opaque to Warren but must be printable and short: 1 to 128 of `A-Z a-z 0-9 . _ - @ :`.
pub fn validate_user_id(user_id: &str) -> Result<(), LifecycleError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-@:".contains(c);
    if user_id.is_empty() || user_id.len() > MAX_USER_ID || !user_id.chars().all(allowed) {
        return Err(LifecycleError::BadRequest(format!(
            "user ID {user_id:?} must be 1 to {MAX_USER_ID} characters of A-Z, a-z, 0-9, '.', '_', '-', '@' or ':'"
        )));
    }
    Ok(())
}

impl Lifecycle {
    /// The user's sandbox (see the module doc).
    pub async fn workspace_sandbox(
        &self,
        request: WorkspaceRequest,
    ) -> Result<WorkspaceSandbox, LifecycleError> {
        validate_user_id(&request.user_id)?;
        let lock = self.lock_for(&format!(
            "workspace/{}/{}",
            request.team_id, request.user_id
        ));
        let _held = lock.lock().await;
        let now = now_millis();
        let existing = self
            .store()
            .get_workspace(&request.team_id, &request.user_id)
            .await?;
        let mut workspace = match existing {
            Some(workspace) => {
                if let Some(asked) = &request.template {
                    if asked != &workspace.template {
                        return Err(LifecycleError::Conflict(format!(
                            "workspace of user {} uses template '{}', not '{asked}'",
                            request.user_id, workspace.template
                        )));
                    }
                }
                workspace
            }
            None => WorkspaceRecord {
                team_id: request.team_id.clone(),
                user_id: request.user_id.clone(),
                template: request
                    .template
                    .clone()
                    .unwrap_or_else(|| DEFAULT_WORKSPACE_TEMPLATE.to_string()),
                sandbox_id: None,
                created_at: now,
                updated_at: now,
            },
        };

        let mut replaced_reason = None;
        if let Some(id) = workspace.sandbox_id.clone() {
            match self.store().get_sandbox(&id).await? {
                Some(record) if !record.state.is_terminal() => {
                    let was_paused =
                        matches!(record.state, SandboxState::Paused | SandboxState::Pausing);
                    match self.resume(&id, request.timeout).await {
                        Ok((sandbox, outcome)) => {
                            let action = match outcome {
                                ResumeOutcome::Resumed => WorkspaceAction::Resumed,
                                ResumeOutcome::AlreadyRunning if was_paused => {
                                    WorkspaceAction::Resumed
                                }
                                ResumeOutcome::AlreadyRunning => WorkspaceAction::Existing,
                            };
                            if action == WorkspaceAction::Resumed {
                                workspace.updated_at = now_millis();
                                let entry = WorkspaceMove {
                                    sandbox_id: id.clone(),
                                    action: action.as_str().to_string(),
                                    reason: Some("was paused".to_string()),
                                    at: workspace.updated_at,
                                };
                                self.store()
                                    .record_workspace_move(&workspace, &entry)
                                    .await?;
                            }
                            return Ok(WorkspaceSandbox {
                                workspace,
                                sandbox,
                                action,
                            });
                        }
                        Err(LifecycleError::NotFound(_)) => {
                            replaced_reason = Some(format!("sandbox {id} was lost"));
                        }
                        Err(other) => return Err(other),
                    }
                }
                Some(record) => {
                    replaced_reason = Some(format!(
                        "sandbox {id} was {}{}",
                        record.state,
                        record
                            .state_reason
                            .map(|reason| format!(" ({reason})"))
                            .unwrap_or_default()
                    ));
                }
                None => replaced_reason = Some(format!("sandbox {id} is not known any more")),
            }
        }

        let created = self
            .create(CreateRequest {
                team_id: request.team_id.clone(),
                template: workspace.template.clone(),
                timeout: request.timeout,
                auto_pause: true,
                metadata: [("warren.workspace.user".to_string(), request.user_id.clone())]
                    .into_iter()
                    .collect(),
                ..CreateRequest::default()
            })
            .await?;
        let action = if replaced_reason.is_some() {
            WorkspaceAction::Replaced
        } else {
            WorkspaceAction::Created
        };
        workspace.sandbox_id = Some(created.record.id.clone());
        workspace.updated_at = now_millis();
        let entry = WorkspaceMove {
            sandbox_id: created.record.id.clone(),
            action: action.as_str().to_string(),
            reason: replaced_reason.or_else(|| Some("first sandbox".to_string())),
            at: workspace.updated_at,
        };
        self.store()
            .record_workspace_move(&workspace, &entry)
            .await?;
        tracing::info!(user = %request.user_id, team = %request.team_id, sandbox = %created.record.id, action = action.as_str(), "workspace sandbox");
        Ok(WorkspaceSandbox {
            workspace,
            sandbox: created.record,
            action,
        })
    }

    /// Every sandbox the user was given, oldest first; `NotFound` for a user without a workspace.
    pub async fn workspace_history(
        &self,
        team_id: &str,
        user_id: &str,
    ) -> Result<(WorkspaceRecord, Vec<WorkspaceMove>), LifecycleError> {
        validate_user_id(user_id)?;
        let Some(workspace) = self.store().get_workspace(team_id, user_id).await? else {
            return Err(LifecycleError::WorkspaceNotFound(user_id.to_string()));
        };
        let history = self.store().workspace_history(team_id, user_id).await?;
        Ok((workspace, history))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_ids_are_short_and_printable() {
        for good in ["alice", "u-42", "a.b_c@example.com", "tenant:7"] {
            assert!(validate_user_id(good).is_ok(), "{good}");
        }
        for bad in ["", "a b", "../x", "x/y", &"x".repeat(129), "é"] {
            assert!(validate_user_id(bad).is_err(), "{bad:?}");
        }
    }
}
