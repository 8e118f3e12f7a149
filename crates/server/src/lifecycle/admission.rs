//! Admission: may one more sandbox start on this node? Counts what live sandboxes hold against the node's
//! limits.

use crate::config::Limits;
use crate::store::{PauseKind, SandboxRecord, TeamRecord};

/// What a sandbox asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    pub vcpus: f64,
    pub memory_mib: u64,
}

/// What the node's sandboxes hold now.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    pub sandboxes: u32,
    pub vcpus: f64,
    pub memory_mib: u64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmissionError {
    #[error("sandbox limit reached: {running} of {max} sandboxes are in use")]
    TooManySandboxes { running: u32, max: u32 },
    #[error("vCPU limit reached: {used} in use + {requested} requested > {max}")]
    Vcpus { used: f64, requested: f64, max: f64 },
    #[error("memory limit reached: {used} MiB in use + {requested} MiB requested > {max} MiB")]
    Memory { used: u64, requested: u64, max: u64 },
    #[error("team {team} quota reached: {what}")]
    TeamQuota { team: String, what: String },
}

impl Usage {
    /// Sum what `sandboxes` hold. A sandbox paused to a checkpoint holds no CPU or memory, only disk; a
    /// frozen one keeps its memory and its slot.
    pub fn of<'a>(sandboxes: impl IntoIterator<Item = &'a SandboxRecord>) -> Usage {
        let mut usage = Usage::default();
        for sandbox in sandboxes {
            if !sandbox.state.holds_resources() || sandbox.pause_kind == Some(PauseKind::Checkpoint)
            {
                continue;
            }
            usage.sandboxes += 1;
            usage.vcpus += sandbox.vcpus;
            usage.memory_mib += sandbox.memory_mib;
        }
        usage
    }
}

/// Admit `request` on a node holding `usage`, or say which limit it would break.
pub fn admit(limits: &Limits, usage: Usage, request: Request) -> Result<(), AdmissionError> {
    if usage.sandboxes >= limits.max_sandboxes {
        return Err(AdmissionError::TooManySandboxes {
            running: usage.sandboxes,
            max: limits.max_sandboxes,
        });
    }
    if usage.vcpus + request.vcpus > limits.max_total_vcpus + f64::EPSILON {
        return Err(AdmissionError::Vcpus {
            used: usage.vcpus,
            requested: request.vcpus,
            max: limits.max_total_vcpus,
        });
    }
    if usage.memory_mib + request.memory_mib > limits.max_total_memory_mib {
        return Err(AdmissionError::Memory {
            used: usage.memory_mib,
            requested: request.memory_mib,
            max: limits.max_total_memory_mib,
        });
    }
    Ok(())
}

/// Admit `request` for `team`, whose sandboxes hold `usage`, against the team's own quotas.
pub fn admit_team(team: &TeamRecord, usage: Usage, request: Request) -> Result<(), AdmissionError> {
    let refuse = |what: String| {
        Err(AdmissionError::TeamQuota {
            team: team.name.clone(),
            what,
        })
    };
    if let Some(max) = team.max_sandboxes {
        if usage.sandboxes >= max {
            return refuse(format!("{} of {max} sandboxes in use", usage.sandboxes));
        }
    }
    if let Some(max) = team.max_vcpus {
        if usage.vcpus + request.vcpus > max + f64::EPSILON {
            return refuse(format!(
                "{} vCPUs in use + {} requested > {max}",
                usage.vcpus, request.vcpus
            ));
        }
    }
    if let Some(max) = team.max_memory_mib {
        if usage.memory_mib + request.memory_mib > max {
            return refuse(format!(
                "{} MiB in use + {} MiB requested > {max} MiB",
                usage.memory_mib, request.memory_mib
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_sandboxes: 2,
            max_total_vcpus: 4.0,
            max_total_memory_mib: 1024,
            ..Limits::default()
        }
    }

    const SMALL: Request = Request {
        vcpus: 1.0,
        memory_mib: 256,
    };

    #[test]
    fn admits_within_limits() {
        assert_eq!(admit(&limits(), Usage::default(), SMALL), Ok(()));
        let usage = Usage {
            sandboxes: 1,
            vcpus: 3.0,
            memory_mib: 768,
        };
        assert_eq!(admit(&limits(), usage, SMALL), Ok(()));
    }

    #[test]
    fn refuses_past_the_sandbox_count() {
        let usage = Usage {
            sandboxes: 2,
            vcpus: 0.0,
            memory_mib: 0,
        };
        assert!(matches!(
            admit(&limits(), usage, SMALL),
            Err(AdmissionError::TooManySandboxes { running: 2, max: 2 })
        ));
    }

    #[test]
    fn refuses_past_vcpus_and_memory() {
        let usage = Usage {
            sandboxes: 1,
            vcpus: 3.5,
            memory_mib: 0,
        };
        assert!(matches!(
            admit(&limits(), usage, SMALL),
            Err(AdmissionError::Vcpus { .. })
        ));
        let usage = Usage {
            sandboxes: 1,
            vcpus: 0.0,
            memory_mib: 800,
        };
        assert!(matches!(
            admit(&limits(), usage, SMALL),
            Err(AdmissionError::Memory { .. })
        ));
    }
}
