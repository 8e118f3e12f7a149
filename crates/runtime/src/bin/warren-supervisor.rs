//! `warren-supervisor run <config.json> --status-fd <fd>`: builds one sandbox and supervises its init.
//! Started by warren-runtime's `LinuxRuntime::create`; not meant to be run by hand.

use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: warren-supervisor run <config.json> --status-fd <fd>";
    let (config, status_fd) = match args.as_slice() {
        [_, run, config, flag, fd] if run == "run" && flag == "--status-fd" => {
            match fd.parse::<i32>() {
                Ok(fd) if fd > 2 => (PathBuf::from(config), fd),
                _ => {
                    eprintln!("{usage}");
                    std::process::exit(2);
                }
            }
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    std::process::exit(warren_runtime::supervisor::run_supervisor(
        &config, status_fd,
    ));
}
