//! dedupctl, the operator API's CLI and the configuration checker: [`dedup_tools::ctl`].

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = dedup_tools::ctl::run(&args, &mut std::io::stdout(), &mut std::io::stderr());
    std::process::ExitCode::from(code)
}
