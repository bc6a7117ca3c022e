//! Library target so `pipelock-user` can list this crate as a build-dependency:
//! that makes cargo rebuild the embedded object when these sources change.
#![no_std]
