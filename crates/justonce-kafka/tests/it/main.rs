//! The Kafka transport against real brokers. Every test is in `kafka`, so that its name says
//! so: `.ci/run` runs the tests named for Kafka last, once its broker is built and up.

mod kafka;
