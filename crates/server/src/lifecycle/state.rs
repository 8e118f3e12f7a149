//! The sandbox state machine: every state, and the one table of allowed transitions. Every change of a
//! sandbox's state goes through [`SandboxState::check_transition`] and is stored as an event.

use std::fmt;
use std::str::FromStr;

use warren_proto::api;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SandboxState {
    /// Admitted and stored; the runtime is starting it.
    Creating,
    Running,
    /// Being checkpointed or frozen.
    Pausing,
    Paused,
    /// Being restored or thawed.
    Resuming,
    /// Destroyed on request or at timeout. Terminal.
    Killed,
    /// Something went wrong (start failed, lost on restart, pause or resume failed irrecoverably). Terminal;
    /// the reason is stored with the event.
    Failed,
}

/// A sandbox operation whose duration is recorded: from entering its in-between state (`creating`,
/// `resuming`, `pausing`) to reaching the state it aims at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Create,
    Resume,
    Pause,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "create",
            Operation::Resume => "resume",
            Operation::Pause => "pause",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sandbox cannot go from {from} to {to}")]
pub struct InvalidTransition {
    pub from: SandboxState,
    pub to: SandboxState,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sandbox state {0:?}")]
pub struct UnknownState(pub String);

impl SandboxState {
    pub const ALL: [SandboxState; 7] = [
        SandboxState::Creating,
        SandboxState::Running,
        SandboxState::Pausing,
        SandboxState::Paused,
        SandboxState::Resuming,
        SandboxState::Killed,
        SandboxState::Failed,
    ];

    /// The transition table. Exhaustive over (from, to): adding a state forces a decision here.
    pub fn check_transition(self, to: SandboxState) -> Result<(), InvalidTransition> {
        use SandboxState::*;
        let allowed = match (self, to) {
            (Creating, Running) => true,
            (Creating, Failed) => true,
            (Creating, Creating | Pausing | Paused | Resuming | Killed) => false,

            (Running, Pausing) => true,
            (Running, Killed) => true,
            (Running, Failed) => true,
            (Running, Creating | Running | Paused | Resuming) => false,

            (Pausing, Paused) => true,
            // The pause did not happen; the sandbox still runs.
            (Pausing, Running) => true,
            (Pausing, Failed) => true,
            (Pausing, Creating | Pausing | Resuming | Killed) => false,

            (Paused, Resuming) => true,
            (Paused, Killed) => true,
            (Paused, Failed) => true,
            (Paused, Creating | Running | Pausing | Paused) => false,

            (Resuming, Running) => true,
            // The resume did not happen; the snapshot or frozen tree is intact.
            (Resuming, Paused) => true,
            (Resuming, Failed) => true,
            (Resuming, Creating | Pausing | Resuming | Killed) => false,

            // Terminal states.
            (Killed, Creating | Running | Pausing | Paused | Resuming | Killed | Failed) => false,
            (Failed, Creating | Running | Pausing | Paused | Resuming | Killed | Failed) => false,
        };
        if allowed {
            Ok(())
        } else {
            Err(InvalidTransition { from: self, to })
        }
    }

    /// The operation a move from `self` to `to` finishes, if it finishes one: its duration is
    /// recorded with the move's event (the dashboard's latency chart reads them back).
    pub fn finishes(self, to: SandboxState) -> Option<Operation> {
        use SandboxState::*;
        match (self, to) {
            (Creating, Running) => Some(Operation::Create),
            (Resuming, Running) => Some(Operation::Resume),
            (Pausing, Paused) => Some(Operation::Pause),
            _ => None,
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, SandboxState::Killed | SandboxState::Failed)
    }

    /// States in which the sandbox holds host resources that admission counts.
    pub fn holds_resources(self) -> bool {
        !self.is_terminal()
    }

    /// The state the E2B API shows; `None` for sandboxes the API treats as gone.
    pub fn api_state(self) -> Option<api::SandboxState> {
        match self {
            SandboxState::Creating | SandboxState::Running | SandboxState::Resuming => {
                Some(api::SandboxState::Running)
            }
            SandboxState::Pausing | SandboxState::Paused => Some(api::SandboxState::Paused),
            SandboxState::Killed | SandboxState::Failed => None,
        }
    }

    /// Internal states an API state stands for.
    pub fn from_api_state(state: api::SandboxState) -> &'static [SandboxState] {
        match state {
            api::SandboxState::Running => &[
                SandboxState::Creating,
                SandboxState::Running,
                SandboxState::Resuming,
            ],
            api::SandboxState::Paused => &[SandboxState::Pausing, SandboxState::Paused],
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Pausing => "pausing",
            SandboxState::Paused => "paused",
            SandboxState::Resuming => "resuming",
            SandboxState::Killed => "killed",
            SandboxState::Failed => "failed",
        }
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SandboxState {
    type Err = UnknownState;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        SandboxState::ALL
            .into_iter()
            .find(|state| state.as_str() == value)
            .ok_or_else(|| UnknownState(value.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SandboxState::*;

    #[test]
    fn lifecycle_paths_are_allowed() {
        for (from, to) in [
            (Creating, Running),
            (Running, Pausing),
            (Pausing, Paused),
            (Paused, Resuming),
            (Resuming, Running),
            (Running, Killed),
            (Paused, Killed),
            (Creating, Failed),
            (Pausing, Running),
            (Resuming, Paused),
        ] {
            assert_eq!(from.check_transition(to), Ok(()), "{from} -> {to}");
        }
    }

    #[test]
    fn only_the_moves_that_end_a_create_resume_or_pause_are_timed_and_all_are_allowed() {
        for from in SandboxState::ALL {
            for to in SandboxState::ALL {
                let expected = match (from, to) {
                    (Creating, Running) => Some(Operation::Create),
                    (Resuming, Running) => Some(Operation::Resume),
                    (Pausing, Paused) => Some(Operation::Pause),
                    _ => None,
                };
                assert_eq!(from.finishes(to), expected, "{from} -> {to}");
                if expected.is_some() {
                    assert_eq!(from.check_transition(to), Ok(()), "{from} -> {to}");
                }
            }
        }
    }

    #[test]
    fn terminal_states_never_move() {
        for from in [Killed, Failed] {
            for to in SandboxState::ALL {
                assert!(from.check_transition(to).is_err(), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn no_state_moves_to_itself_or_back_to_creating() {
        for state in SandboxState::ALL {
            assert!(state.check_transition(state).is_err(), "{state} -> {state}");
            assert!(
                state.check_transition(Creating).is_err(),
                "{state} -> creating"
            );
        }
    }

    #[test]
    fn every_live_state_can_fail() {
        for state in SandboxState::ALL.into_iter().filter(|s| !s.is_terminal()) {
            assert_eq!(state.check_transition(Failed), Ok(()), "{state}");
        }
    }

    #[test]
    fn skipping_the_intermediate_states_is_refused() {
        assert!(Running.check_transition(Paused).is_err());
        assert!(Paused.check_transition(Running).is_err());
        assert!(Creating.check_transition(Killed).is_err());
    }

    #[test]
    fn names_round_trip() {
        for state in SandboxState::ALL {
            assert_eq!(state.as_str().parse::<SandboxState>(), Ok(state));
        }
        assert!("bogus".parse::<SandboxState>().is_err());
    }

    #[test]
    fn api_states_cover_live_states() {
        for state in SandboxState::ALL {
            match state.api_state() {
                Some(api) => assert!(SandboxState::from_api_state(api).contains(&state)),
                None => assert!(state.is_terminal()),
            }
        }
    }
}
