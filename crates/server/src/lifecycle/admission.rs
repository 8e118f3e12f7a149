//! Admission: may one more sandbox start on this node? Counts what live sandboxes hold against the node's
//! configured limits and against what the host really has left (its task ceiling and the state disk's
//! free space, measured by the runtime at every admission: [`HostCapacity`]).

use warren_runtime::HostCapacity;

use super::state::SandboxState;
use crate::config::Limits;
use crate::store::{PauseKind, SandboxRecord, TeamRecord};

const MIB: u64 = 1024 * 1024;

/// What a sandbox asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    pub vcpus: f64,
    pub memory_mib: u64,
    /// Its `pids.max`.
    pub max_pids: u64,
    /// Size of its writable layer (a sparse image that grows up to this).
    pub disk_mib: u64,
}

/// What the node's sandboxes hold now.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    pub sandboxes: u32,
    pub vcpus: f64,
    pub memory_mib: u64,
    /// Sum of the live sandboxes' task limits.
    pub tasks: u64,
    /// Writable layers of sandboxes still being created or resumed, whose images the runtime's
    /// measurement may not see yet.
    pub pending_disk_mib: u64,
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
    #[error(
        "host task capacity reached: sandboxes may hold {used} tasks + {requested} requested > \
         {max} this host can give sandboxes (kernel pid_max/threads-max less a reserve)"
    )]
    Tasks { used: u64, requested: u64, max: u64 },
    /// Every node is at its own limits (cluster mode).
    #[error("every node is full: {0}")]
    NodesFull(String),
    #[error(
        "insufficient storage: the sandbox's {requested_mib} MiB writable layer does not fit in the \
         {available_mib} MiB the state disk has left for sandboxes (free space less a \
         {reserve_mib} MiB reserve, less {promised_mib} MiB that live sandboxes' disks may still \
         grow by and {pending_mib} MiB for those being created or resumed)"
    )]
    Storage {
        requested_mib: u64,
        available_mib: u64,
        reserve_mib: u64,
        promised_mib: u64,
        pending_mib: u64,
    },
}

impl AdmissionError {
    /// Whether the refusal is about storage (507) rather than capacity (429).
    pub fn is_storage(&self) -> bool {
        matches!(self, AdmissionError::Storage { .. })
    }
}

impl Usage {
    /// Sum what `sandboxes` hold, each with a task limit of `max_pids`. A sandbox paused to a
    /// checkpoint holds no CPU, memory or tasks, only disk (its checkpoint, already off the free
    /// space); a frozen one keeps its memory, tasks and slot.
    pub fn of<'a>(sandboxes: impl IntoIterator<Item = &'a SandboxRecord>, max_pids: u64) -> Usage {
        let mut usage = Usage::default();
        for sandbox in sandboxes {
            if !sandbox.state.holds_resources()
                || sandbox.pause_kind.is_some_and(PauseKind::on_disk)
            {
                continue;
            }
            usage.sandboxes += 1;
            usage.vcpus += sandbox.vcpus;
            usage.memory_mib += sandbox.memory_mib;
            usage.tasks += max_pids;
            if matches!(
                sandbox.state,
                SandboxState::Creating | SandboxState::Resuming
            ) {
                usage.pending_disk_mib += sandbox.disk_mib;
            }
        }
        usage
    }
}

/// Admit `request` on a node holding `usage` whose host has `capacity` left, or say which limit it
/// would break.
pub fn admit(
    limits: &Limits,
    usage: Usage,
    request: Request,
    capacity: HostCapacity,
) -> Result<(), AdmissionError> {
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
    if usage.tasks.saturating_add(request.max_pids) > capacity.sandbox_tasks {
        return Err(AdmissionError::Tasks {
            used: usage.tasks,
            requested: request.max_pids,
            max: capacity.sandbox_tasks,
        });
    }
    let available = capacity
        .sandbox_disk_bytes(limits.disk_overcommit)
        .saturating_sub(usage.pending_disk_mib.saturating_mul(MIB));
    if request.disk_mib.saturating_mul(MIB) > available {
        return Err(AdmissionError::Storage {
            requested_mib: request.disk_mib,
            available_mib: available / MIB,
            reserve_mib: capacity.disk_reserve_bytes / MIB,
            promised_mib: capacity.disk_promised_bytes / MIB,
            pending_mib: usage.pending_disk_mib,
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
        max_pids: 4096,
        disk_mib: 2048,
    };

    const PLENTY: HostCapacity = HostCapacity {
        sandbox_tasks: u64::MAX,
        disk_free_bytes: u64::MAX,
        disk_reserve_bytes: 0,
        disk_promised_bytes: 0,
    };

    #[test]
    fn admits_within_limits() {
        assert_eq!(admit(&limits(), Usage::default(), SMALL, PLENTY), Ok(()));
        let usage = Usage {
            sandboxes: 1,
            vcpus: 3.0,
            memory_mib: 768,
            ..Usage::default()
        };
        assert_eq!(admit(&limits(), usage, SMALL, PLENTY), Ok(()));
    }

    #[test]
    fn task_limits_stay_within_the_host_ceiling() {
        // pid_max 32,768 less the kernel's 300 and a tenth: 29,222 tasks for sandboxes, i.e. seven
        // sandboxes of 4,096 (the eight would take the host's last PIDs).
        let capacity = HostCapacity {
            sandbox_tasks: 29_222,
            ..PLENTY
        };
        let limits = Limits {
            max_sandboxes: 64,
            max_total_vcpus: 64.0,
            max_total_memory_mib: 64 * 1024,
            ..Limits::default()
        };
        let usage = |sandboxes: u32| Usage {
            sandboxes,
            tasks: u64::from(sandboxes) * 4096,
            ..Usage::default()
        };
        assert_eq!(admit(&limits, usage(6), SMALL, capacity), Ok(()));
        let refused = admit(&limits, usage(7), SMALL, capacity).unwrap_err();
        assert_eq!(
            refused,
            AdmissionError::Tasks {
                used: 28_672,
                requested: 4096,
                max: 29_222
            }
        );
        assert!(!refused.is_storage());
        assert!(refused.to_string().contains("task capacity"), "{refused}");
    }

    #[test]
    fn disks_must_fit_the_free_space_left() {
        let capacity = HostCapacity {
            disk_free_bytes: 5 * 1024 * MIB,
            ..PLENTY
        };
        assert_eq!(admit(&limits(), Usage::default(), SMALL, capacity), Ok(()));
        // Two sandboxes still being created will claim 4 GiB the measurement does not show yet.
        let pending = Usage {
            pending_disk_mib: 4096,
            ..Usage::default()
        };
        let refused = admit(&limits(), pending, SMALL, capacity).unwrap_err();
        assert_eq!(
            refused,
            AdmissionError::Storage {
                requested_mib: 2048,
                available_mib: 1024,
                reserve_mib: 0,
                promised_mib: 0,
                pending_mib: 4096,
            }
        );
        assert!(refused.is_storage());
        assert!(
            refused.to_string().contains("insufficient storage"),
            "{refused}"
        );
    }

    #[test]
    fn an_overcommitted_disk_promises_more_than_it_has() {
        // 4 GiB above a 1 GiB reserve, 3 GiB of it already promised to live sandboxes' layers.
        let capacity = HostCapacity {
            disk_free_bytes: 5 * 1024 * MIB,
            disk_reserve_bytes: 1024 * MIB,
            disk_promised_bytes: 3 * 1024 * MIB,
            ..PLENTY
        };
        let refused = admit(&limits(), Usage::default(), SMALL, capacity).unwrap_err();
        assert!(
            matches!(
                refused,
                AdmissionError::Storage {
                    available_mib: 1024,
                    reserve_mib: 1024,
                    promised_mib: 3072,
                    ..
                }
            ),
            "{refused:?}"
        );
        // Twice over: 8 GiB may be promised, 5 GiB with this one.
        let overcommitted = Limits {
            disk_overcommit: 2.0,
            ..limits()
        };
        assert_eq!(
            admit(&overcommitted, Usage::default(), SMALL, capacity),
            Ok(())
        );
        let pending = Usage {
            pending_disk_mib: 4096,
            ..Usage::default()
        };
        assert!(admit(&overcommitted, pending, SMALL, capacity).is_err());
    }

    #[test]
    fn refuses_past_the_sandbox_count() {
        let usage = Usage {
            sandboxes: 2,
            ..Usage::default()
        };
        assert!(matches!(
            admit(&limits(), usage, SMALL, PLENTY),
            Err(AdmissionError::TooManySandboxes { running: 2, max: 2 })
        ));
    }

    #[test]
    fn refuses_past_vcpus_and_memory() {
        let usage = Usage {
            sandboxes: 1,
            vcpus: 3.5,
            ..Usage::default()
        };
        assert!(matches!(
            admit(&limits(), usage, SMALL, PLENTY),
            Err(AdmissionError::Vcpus { .. })
        ));
        let usage = Usage {
            sandboxes: 1,
            memory_mib: 800,
            ..Usage::default()
        };
        assert!(matches!(
            admit(&limits(), usage, SMALL, PLENTY),
            Err(AdmissionError::Memory { .. })
        ));
    }
}
