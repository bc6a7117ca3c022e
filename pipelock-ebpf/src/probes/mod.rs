//! The programs, by what they observe.
mod asked_twice;
mod capability;
mod contention;
mod empty;
mod follow;
mod holder;
mod lockref;
mod pipe;
mod selftest;
