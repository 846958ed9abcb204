//! `ddbpipe`: get data out of Amazon DynamoDB. The command is the library's (`ddbpipe::cli`).

fn main() -> std::process::ExitCode {
    ddbpipe::cli::main()
}
