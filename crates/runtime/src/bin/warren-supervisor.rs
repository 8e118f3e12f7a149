//! `warren-supervisor run <config.json> --status-fd <fd>`: builds one sandbox and supervises its init.
//! Started by warren-runtime's `LinuxRuntime::create`; not meant to be run by hand. Once the sandbox
//! is up, the supervisor re-executes itself as `warren-supervisor wait <init-pid> <sandbox-dir>`,
//! a small image that only waits for the init and records how it ended. When that process dies
//! (killed from outside), `warren-supervisor adopt <init-pid> <sandbox-dir>` starts a detached `wait`
//! for the running init again and prints its pid: the sandbox gets its dead man's switch back.
//! `warren-supervisor standby --status-fd <fd>` is the same supervisor started ahead of need: it reads
//! the configuration's path from its stdin when a sandbox is created (see `supervisor::standby`).
//! `warren-supervisor serve-pages <checkpoint> <images> <socket-fd> <report-fd>` answers the page
//! requests of a lazy restore's `criu lazy-pages` daemon from the checkpoint (started by `run`).

use std::path::{Path, PathBuf};

const USAGE: &str = "usage: warren-supervisor run <config.json> --status-fd <fd> \
     | standby --status-fd <fd> | adopt <init-pid> <sandbox-dir> \
     | serve-pages <checkpoint> <images> <socket-fd> <report-fd>";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let code = match args.as_slice() {
        [_, run, config, flag, fd] if run == "run" && flag == "--status-fd" => {
            match fd.parse::<i32>() {
                Ok(fd) if fd == 1 || fd > 2 => {
                    warren_runtime::supervisor::run_supervisor(&PathBuf::from(config), fd)
                }
                _ => usage(),
            }
        }
        [_, standby, flag, fd] if standby == "standby" && flag == "--status-fd" => {
            match fd.parse::<i32>() {
                Ok(fd) if fd == 1 || fd > 2 => warren_runtime::supervisor::run_standby(fd),
                _ => usage(),
            }
        }
        [_, wait, pid, dir] if wait == "wait" => match pid.parse::<u32>() {
            Ok(pid) if pid > 1 => warren_runtime::supervisor::wait_and_record(pid, Path::new(dir)),
            _ => usage(),
        },
        [_, adopt, pid, dir] if adopt == "adopt" => match pid.parse::<u32>() {
            Ok(pid) if pid > 1 => warren_runtime::supervisor::adopt(pid, Path::new(dir)),
            _ => usage(),
        },
        [_, serve, checkpoint, images, socket, report] if serve == "serve-pages" => {
            match (socket.parse::<i32>(), report.parse::<i32>()) {
                (Ok(socket), Ok(report)) if socket > 2 && report > 2 => {
                    warren_runtime::checkpoint::lazy_pages::serve_pages(
                        Path::new(checkpoint),
                        Path::new(images),
                        socket,
                        report,
                    )
                }
                _ => usage(),
            }
        }
        _ => usage(),
    };
    std::process::exit(code);
}

fn usage() -> i32 {
    eprintln!("{USAGE}");
    2
}
