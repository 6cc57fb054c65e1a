-- Two repairs of tansu 0.6.0's SQLite storage, run once tansu has made its tables and
-- no-ops after. The harness (`OwnBroker`, harness.rs) runs them after every start, and
-- scripts/services.sh on the machine's broker.

-- tansu keeps a record's headers in a table `header` with no index, and a fetch reads each
-- record's headers with a join on (topition, offset_id): a scan of every header stored, for
-- every record fetched. A broker holding 60,000 records spent a whole core to serve 120 a
-- second, and slowed further as the topic grew.
CREATE INDEX IF NOT EXISTS justonce_header_record ON header (topition, offset_id);

-- The last statement of a topic deletion (`topic_delete_by.sql`) deletes the topics whose
-- cluster is the named topic's cluster: every topic, not the one named, and by ON DELETE
-- CASCADE their partitions, watermarks and records (fixed upstream after 0.6.0, in no
-- release this machine can install). A consumer of another topic then meets a partition
-- with no watermark and the storage panics ("more or less than one row"): every later
-- request of every client fails. The statements before it delete the named topic's
-- partitions, so a topic's row goes only once it has none left; the rows of every other
-- topic are skipped (RAISE(IGNORE)).
CREATE TRIGGER IF NOT EXISTS justonce_topic_delete_one
  BEFORE DELETE ON topic FOR EACH ROW
  WHEN EXISTS (SELECT 1 FROM topition WHERE topition.topic = OLD.id)
  BEGIN SELECT RAISE(IGNORE); END;
