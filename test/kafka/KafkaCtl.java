/*
 * test/kafka/KafkaCtl.java
 *
 * Admin helper of test/tools/kafka_cluster, run as a single-file program
 * (java -cp <kafka class path> KafkaCtl.java ...) with the Java client that
 * the broker's class path already holds.
 *
 *   topic BOOTSTRAP NAME PARTITIONS RF [config=value ...]   create a topic
 *   ready BOOTSTRAP TOPIC RF SECONDS create TOPIC (1 partition) if missing and
 *                                    retry an acks=all produce to it until one
 *                                    is acknowledged
 */
import java.util.*;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.serialization.StringSerializer;

public class KafkaCtl {
    /* Admin client with short timeouts: a test must not hang on a sick cluster. */
    static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        return Admin.create(p);
    }

    /* Create a topic; "already exists" is an error (a test expects a fresh one). */
    static void topic(String[] a) throws Exception {
        Map<String, String> configs = new HashMap<>();
        for (int i = 5; i < a.length; i++) {
            int eq = a[i].indexOf('=');
            if (eq <= 0)
                throw new IllegalArgumentException("config must be name=value: " + a[i]);
            configs.put(a[i].substring(0, eq), a[i].substring(eq + 1));
        }
        NewTopic t = new NewTopic(a[2], Integer.parseInt(a[3]), Short.parseShort(a[4])).configs(configs);
        try (Admin ad = admin(a[1])) {
            ad.createTopics(List.of(t)).all().get(30, TimeUnit.SECONDS);
        }
    }

    /* Create the probe topic, then produce to it with acks=all, until it works or time runs out. */
    static void ready(String[] a) throws Exception {
        long deadline = System.currentTimeMillis() + 1000L * Integer.parseInt(a[4]);
        Exception last = null;
        boolean created = false;
        while (!created && System.currentTimeMillis() < deadline) {
            try (Admin ad = admin(a[1])) {
                ad.createTopics(List.of(new NewTopic(a[2], 1, Short.parseShort(a[3]))))
                    .all().get(20, TimeUnit.SECONDS);
                created = true;
            } catch (java.util.concurrent.ExecutionException e) {
                if (e.getCause() instanceof org.apache.kafka.common.errors.TopicExistsException)
                    created = true;
                else {
                    last = e;
                    Thread.sleep(500);
                }
            }
        }
        if (!created)
            throw new Exception("cannot create " + a[2] + " within " + a[4] + " s", last);
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, a[1]);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "5000");
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "4000");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "0");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "5000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        while (System.currentTimeMillis() < deadline) {
            try (Producer<String, String> pr = new KafkaProducer<>(p)) {
                pr.send(new ProducerRecord<>(a[2], "probe")).get(10, TimeUnit.SECONDS);
                return;
            } catch (Exception e) {
                last = e;
                Thread.sleep(500);
            }
        }
        throw new Exception("no acks=all produce to " + a[2] + " within " + a[4] + " s", last);
    }

    public static void main(String[] a) throws Exception {
        try {
            if (a.length >= 5 && a[0].equals("topic"))
                topic(a);
            else if (a.length == 5 && a[0].equals("ready"))
                ready(a);
            else {
                System.err.println("usage: KafkaCtl topic|ready ... (see the source)");
                System.exit(3);
            }
        } catch (Exception e) {
            Throwable t = e;
            while (t.getCause() != null && (t instanceof java.util.concurrent.ExecutionException
                                            || t.getMessage() == null))
                t = t.getCause();
            System.err.println("KafkaCtl: " + t);
            System.exit(1);
        }
    }
}
