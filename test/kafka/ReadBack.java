/*
 * test/kafka/ReadBack.java
 *
 * Reads topics back with the Java Kafka client (not librdkafka) and judges
 * them like test/tools/order_check does, but independently: per aggregate
 * it keeps the set of versions seen.  The tests compare both verdicts, to
 * check the order checker itself.  Run as a single-file program:
 *
 *   java -cp <kafka class path> ReadBack.java BOOTSTRAP [--expect FILE]
 *        [-X prop=value ...] TOPIC [TOPIC ...]
 *
 * Prints "readback: messages=.. aggregates=.. accepted=.. duplicates=..
 * gaps=.. inversions=.. lost=.. split=.." (lost only with --expect).
 */
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class ReadBack {
    static class Agg {
        long highest;
        Set<Long> seen = new HashSet<>();
        TopicPartition home;
        boolean split;
    }

    static long messages, accepted, duplicates, gaps, inversions, split;
    static Map<String, Agg> aggs = new HashMap<>();

    static String header(ConsumerRecord<byte[], byte[]> r, String name) {
        Header h = r.headers().lastHeader(name);
        return h == null ? null : new String(h.value(), StandardCharsets.UTF_8);
    }

    /* The same rules as order_check, stated on the set of seen versions. */
    static void judge(TopicPartition tp, String id, long v) {
        Agg a = aggs.computeIfAbsent(id, k -> new Agg());
        if (a.home == null)
            a.home = tp;
        else if (!a.home.equals(tp) && !a.split) {
            a.split = true;
            split++;
        }
        if (a.highest == 0 ? v == 1 : v == a.highest + 1)
            accepted++;
        else if (v > a.highest + 1)
            gaps++;
        else if (a.seen.contains(v))
            duplicates++;
        else
            inversions++;
        a.seen.add(v);
        a.highest = Math.max(a.highest, v);
    }

    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        List<String> topics = new ArrayList<>();
        String expect = null;
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        for (int i = 1; i < args.length; i++) {
            if (args[i].equals("--expect"))
                expect = args[++i];
            else if (args[i].equals("-X")) {
                String[] kv = args[++i].split("=", 2);
                p.put(kv[0], kv[1]);
            } else
                topics.add(args[i]);
        }
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());

        try (Consumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            for (String t : topics) {
                List<TopicPartition> tps = new ArrayList<>();
                for (PartitionInfo pi : c.partitionsFor(t, Duration.ofSeconds(30)))
                    tps.add(new TopicPartition(t, pi.partition()));
                tps.sort(Comparator.comparingInt(TopicPartition::partition));
                /* one partition at a time, like order_check judges them */
                for (TopicPartition tp : tps) {
                    c.assign(List.of(tp));
                    c.seekToBeginning(List.of(tp));
                    long end = c.endOffsets(List.of(tp), Duration.ofSeconds(30)).get(tp);
                    long deadline = System.currentTimeMillis() + 120000;
                    while (c.position(tp, Duration.ofSeconds(30)) < end) {
                        if (System.currentTimeMillis() > deadline)
                            throw new Exception("timeout reading " + tp);
                        for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) {
                            if (r.offset() >= end)
                                continue;
                            messages++;
                            String id = header(r, "aggregate_id");
                            String v = header(r, "aggregate_version");
                            if (id != null && v != null)
                                judge(tp, id, Long.parseLong(v));
                        }
                    }
                }
            }
        }

        String lost = "";
        if (expect != null) {
            long n = 0;
            for (String line : Files.readAllLines(Paths.get(expect))) {
                String[] f = line.split("\t");
                if (f.length != 2)
                    continue;
                Agg a = aggs.get(f[0]);
                long last = Long.parseLong(f[1]);
                for (long v = 1; v <= last; v++)
                    if (a == null || !a.seen.contains(v))
                        n++;
            }
            lost = " lost=" + n;
        }
        System.out.println("readback: messages=" + messages + " aggregates=" + aggs.size()
                           + " accepted=" + accepted + " duplicates=" + duplicates
                           + " gaps=" + gaps + " inversions=" + inversions + lost
                           + " split=" + split);
    }
}
