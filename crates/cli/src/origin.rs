//! Where a pipeline's config came from, so that a remedy says how to run it again or forget its
//! position in the words of whoever runs it: the command's for a pipeline file
//! (`ddbpipe run orders.yaml`), the library's for YAML given in code (`Pipeline::from_yaml`),
//! which has no file a command could be given.

use std::path::{Path, PathBuf};

/// Where a pipeline's config came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A pipeline file, as the user named it.
    File(PathBuf),
    /// YAML text a program gave.
    Code,
}

impl Origin {
    /// The pipeline file, if the config came from one.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Origin::File(path) => Some(path),
            Origin::Code => None,
        }
    }

    /// How the pipeline is run again, as the subject of a sentence ("… resumes after it"):
    /// "`ddbpipe run orders.yaml`", or "running the pipeline again".
    pub fn rerun(&self) -> String {
        match self {
            Origin::File(path) => format!("`ddbpipe run {}`", path.display()),
            Origin::Code => "running the pipeline again".to_string(),
        }
    }

    /// How the stored position is forgotten, as an instruction: "run `ddbpipe state reset
    /// orders.yaml`", or, for YAML given in code, what that command does by hand.
    pub fn reset(&self) -> String {
        match self {
            Origin::File(path) => format!("run `ddbpipe state reset {}`", path.display()),
            Origin::Code => "delete the pipeline's position where it is kept (its entry in the \
                             state file or in the checkpoint store given in code, its \
                             _ddbpipe_state row in a keyed sink's database; `ddbpipe state \
                             reset` does this for a pipeline file)"
                .to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Origin;

    #[test]
    fn a_remedy_names_the_command_only_for_a_pipeline_file() {
        let file = Origin::File("pipes/orders.yaml".into());
        assert_eq!(file.rerun(), "`ddbpipe run pipes/orders.yaml`");
        assert_eq!(file.reset(), "run `ddbpipe state reset pipes/orders.yaml`");
        let code = Origin::Code;
        assert!(!code.rerun().contains("ddbpipe run"), "{}", code.rerun());
        assert!(code.reset().starts_with("delete the pipeline's position"));
    }
}
