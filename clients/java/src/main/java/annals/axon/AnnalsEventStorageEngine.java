package annals.axon;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import jakarta.annotation.Nonnull;
import jakarta.annotation.Nullable;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;
import org.axonframework.common.infra.ComponentDescriptor;
import org.axonframework.conversion.Converter;
import org.axonframework.eventsourcing.eventstore.AppendCondition;
import org.axonframework.eventsourcing.eventstore.AppendEventsTransactionRejectedException;
import org.axonframework.eventsourcing.eventstore.ConsistencyMarker;
import org.axonframework.eventsourcing.eventstore.EmptyAppendTransaction;
import org.axonframework.eventsourcing.eventstore.EventStorageEngine;
import org.axonframework.eventsourcing.eventstore.GlobalIndexConsistencyMarker;
import org.axonframework.eventsourcing.eventstore.GlobalIndexPosition;
import org.axonframework.eventsourcing.eventstore.SourcingCondition;
import org.axonframework.eventsourcing.eventstore.TaggedEventMessage;
import org.axonframework.messaging.core.Context;
import org.axonframework.messaging.core.DelayedMessageStream;
import org.axonframework.messaging.core.MessageStream;
import org.axonframework.messaging.core.MessageType;
import org.axonframework.messaging.core.QualifiedName;
import org.axonframework.messaging.core.QueueMessageStream;
import org.axonframework.messaging.core.unitofwork.ProcessingContext;
import org.axonframework.messaging.eventhandling.EventMessage;
import org.axonframework.messaging.eventhandling.GenericEventMessage;
import org.axonframework.messaging.eventhandling.TerminalEventMessage;
import org.axonframework.messaging.eventhandling.processing.streaming.token.GlobalSequenceTrackingToken;
import org.axonframework.messaging.eventhandling.processing.streaming.token.TrackingToken;
import org.axonframework.messaging.eventstreaming.EventCriteria;
import org.axonframework.messaging.eventstreaming.EventCriterion;
import org.axonframework.messaging.eventstreaming.StreamingCondition;
import org.axonframework.messaging.eventstreaming.Tag;

/**
 * An Axon Framework 5 {@link EventStorageEngine} backed by an Annals server over its HTTP API.
 *
 * <p>How Axon's model maps onto Annals':
 * <ul>
 *   <li>An event's position in Annals' log is its global index: its tracking token is
 *   {@code GlobalSequenceTrackingToken(position)}, and a stream from token {@code t} delivers the
 *   events after {@code t}.</li>
 *   <li>Criteria become a DCB query: each criterion's types OR-ed and tags AND-ed, the criteria
 *   OR-ed. A tag is written as its key and value (see {@link TagCodec}).</li>
 *   <li>A consistency marker is a position: sourcing answers the head of the log it read to as a
 *   {@link GlobalIndexConsistencyMarker}, and an append condition becomes the DCB condition that
 *   no event matching the criteria was appended after it. The check and the append are one
 *   step in the server, at {@code commit}; a conflict fails it with
 *   {@link AppendEventsTransactionRejectedException}.</li>
 *   <li>The event's payload (a {@code byte[]}, a {@code String} as UTF-8, or anything a given
 *   {@link Converter} turns into bytes) is the Annals event's data; its identifier, timestamp,
 *   type version and metadata are kept in the Annals event's metadata, and an identifier that
 *   is a UUID is also the Annals event's id (a conditional append sent again is then
 *   recognised as the one stored).</li>
 * </ul>
 */
public class AnnalsEventStorageEngine implements EventStorageEngine, AutoCloseable {

    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Duration TIMEOUT = Duration.ofSeconds(30);

    private final String url;
    private final String apiKey;
    private final Converter converter;
    private final HttpClient http;
    private final ExecutorService streams;

    /** An engine of the server at {@code url} (for example {@code http://127.0.0.1:7400}). */
    public AnnalsEventStorageEngine(String url) {
        this(url, null, null);
    }

    /**
     * An engine of the server at {@code url}; {@code apiKey}, when not null, is sent as a bearer
     * token; {@code converter}, when not null, turns payloads other than bytes and strings into
     * bytes.
     */
    public AnnalsEventStorageEngine(String url, @Nullable String apiKey, @Nullable Converter converter) {
        URI base = URI.create(url);
        if (!"http".equals(base.getScheme()) && !"https".equals(base.getScheme())) {
            throw new IllegalArgumentException("Annals: the server's URL " + url + ": expected http:// or https://");
        }
        this.url = url.replaceAll("/+$", "");
        this.apiKey = apiKey;
        this.converter = converter;
        this.streams = Executors.newCachedThreadPool(runnable -> {
            Thread thread = new Thread(runnable, "annals-stream");
            thread.setDaemon(true);
            return thread;
        });
        this.http = HttpClient.newBuilder()
                              .version(HttpClient.Version.HTTP_1_1)
                              .connectTimeout(Duration.ofSeconds(10))
                              .executor(streams)
                              .build();
    }

    // ---- appending

    @Override
    public CompletableFuture<AppendTransaction<?>> appendEvents(@Nonnull AppendCondition condition,
                                                                @Nullable ProcessingContext context,
                                                                @Nonnull List<TaggedEventMessage<?>> events) {
        if (events.isEmpty()) {
            return CompletableFuture.completedFuture(EmptyAppendTransaction.INSTANCE);
        }
        ObjectNode body = JSON.createObjectNode();
        ArrayNode wire = body.putArray("events");
        try {
            for (TaggedEventMessage<?> tagged : events) {
                wire.add(toWire(tagged));
            }
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
        ConsistencyMarker marker = condition.consistencyMarker();
        if (marker != ConsistencyMarker.INFINITY) {
            ObjectNode wireCondition = body.putObject("condition");
            wireCondition.set("failIfEventsMatch", query(condition.criteria()));
            wireCondition.put("after", Math.max(GlobalIndexConsistencyMarker.position(marker), 0));
        }
        return CompletableFuture.completedFuture(new Transaction(body, marker));
    }

    /** Nothing is sent until {@code commit}: the server checks the condition and appends at once. */
    private final class Transaction implements AppendTransaction<Long> {

        private final ObjectNode body;
        private final ConsistencyMarker marker;
        private final AtomicBoolean finished = new AtomicBoolean();

        Transaction(ObjectNode body, ConsistencyMarker marker) {
            this.body = body;
            this.marker = marker;
        }

        @Override
        public CompletableFuture<Long> commit(@Nullable ProcessingContext context) {
            if (!finished.compareAndSet(false, true)) {
                return CompletableFuture.failedFuture(new IllegalStateException("the transaction is already finished"));
            }
            return send(post("/v1/append", body)).thenApply(answer -> {
                if (answer.path("appendConditionFailed").asBoolean(false)) {
                    throw new CompletionException(AppendEventsTransactionRejectedException.conflictingEventsDetected(marker));
                }
                return answer.path("position").asLong();
            });
        }

        @Override
        public void rollback(@Nullable ProcessingContext context) {
            finished.set(true);
        }

        @Override
        public CompletableFuture<ConsistencyMarker> afterCommit(Long position, @Nullable ProcessingContext context) {
            return CompletableFuture.completedFuture(new GlobalIndexConsistencyMarker(position));
        }
    }

    private ObjectNode toWire(TaggedEventMessage<?> tagged) {
        EventMessage event = tagged.event();
        ObjectNode wire = JSON.createObjectNode();
        wire.put("type", event.type().qualifiedName().name());
        ArrayNode tags = wire.putArray("tags");
        for (Tag tag : tagged.tags()) {
            tags.add(TagCodec.encode(tag));
        }
        wire.put("data", Base64.getEncoder().encodeToString(payloadBytes(event)));
        wire.put("dataEncoding", "base64");
        if (isUuid(event.identifier())) {
            wire.put("id", event.identifier());
        }
        ObjectNode axon = wire.putObject("metadata");
        axon.put("identifier", event.identifier());
        axon.put("timestamp", event.timestamp().toString());
        axon.put("version", event.type().version());
        ObjectNode metadata = axon.putObject("metadata");
        event.metadata().forEach(metadata::put);
        return wire;
    }

    private byte[] payloadBytes(EventMessage event) {
        Object payload = event.payload();
        if (payload instanceof byte[] bytes) {
            return bytes;
        }
        if (payload instanceof String text) {
            return text.getBytes(StandardCharsets.UTF_8);
        }
        if (converter != null) {
            return event.payloadAs(byte[].class, converter);
        }
        throw new IllegalArgumentException("Annals: a payload of type " + event.payloadType().getName()
                                                   + " needs a Converter to bytes (given to the engine)");
    }

    private static boolean isUuid(String identifier) {
        try {
            return UUID.fromString(identifier).toString().equalsIgnoreCase(identifier);
        } catch (IllegalArgumentException e) {
            return false;
        }
    }

    // ---- sourcing

    @Override
    public MessageStream<EventMessage> source(@Nonnull SourcingCondition condition, @Nullable ProcessingContext context) {
        long start = GlobalIndexPosition.toIndex(condition.start());
        Map<String, String> params = new HashMap<>();
        JsonNode query = query(condition.criteria());
        if (!query.path("items").isEmpty()) {
            params.put("query", query.toString());
        }
        if (start > 0) {
            params.put("options", JSON.createObjectNode().put("after", start).toString());
        }
        CompletableFuture<MessageStream<EventMessage>> read = http
                .sendAsync(get("/v1/read", params), HttpResponse.BodyHandlers.ofLines())
                .handle((response, error) -> {
                    if (error != null) {
                        throw new CompletionException(new AnnalsException.Unreachable(url, unwrap(error)));
                    }
                    check(response.statusCode(), () -> String.join("\n", response.body().toList()));
                    long head = Long.parseLong(response.headers().firstValue("annals-head").orElse("0"));
                    List<Map.Entry<EventMessage, Context>> entries = new ArrayList<>();
                    try (java.util.stream.Stream<String> body = response.body()) {
                        Iterator<String> lines = body.iterator();
                        while (lines.hasNext()) {
                            String line = lines.next();
                            if (!line.isBlank()) {
                                entries.add(fromWire(parse(line)));
                            }
                        }
                    }
                    entries.add(Map.entry(TerminalEventMessage.INSTANCE,
                                          Context.with(ConsistencyMarker.RESOURCE_KEY, new GlobalIndexConsistencyMarker(head))));
                    return MessageStream.fromStream(entries.stream(), Map.Entry::getKey, Map.Entry::getValue);
                });
        return DelayedMessageStream.create(read);
    }

    private Map.Entry<EventMessage, Context> fromWire(JsonNode wire) {
        long position = wire.path("position").asLong();
        String dataText = wire.path("data").asText("");
        byte[] data = "base64".equals(wire.path("dataEncoding").asText())
                ? Base64.getDecoder().decode(dataText)
                : dataText.getBytes(StandardCharsets.UTF_8);
        JsonNode axon = wire.path("metadata");
        String identifier = axon.hasNonNull("identifier") ? axon.get("identifier").asText()
                : wire.hasNonNull("id") ? wire.get("id").asText() : "annals-" + position;
        Instant timestamp = timestamp(axon.path("timestamp"), wire.path("appendedAt").asLong());
        String version = axon.hasNonNull("version") ? axon.get("version").asText() : MessageType.DEFAULT_VERSION;
        Map<String, String> metadata = new HashMap<>();
        axon.path("metadata").fields().forEachRemaining(field -> metadata.put(field.getKey(), field.getValue().asText()));
        MessageType type = new MessageType(new QualifiedName(wire.path("type").asText()), version);
        EventMessage message = new GenericEventMessage(identifier, type, data, metadata, timestamp);
        Set<Tag> tags = new HashSet<>();
        wire.path("tags").forEach(tag -> tags.add(TagCodec.decode(tag.asText())));
        Context context = Context.with(TrackingToken.RESOURCE_KEY, new GlobalSequenceTrackingToken(position))
                                 .withResource(Tag.RESOURCE_KEY, tags);
        return Map.entry(message, context);
    }

    /**
     * The event's timestamp as this engine stored it; for an event another client wrote (no such
     * field, or one that is not an instant), when Annals appended it.
     */
    private static Instant timestamp(JsonNode stored, long appendedAtMicros) {
        if (stored.isTextual()) {
            try {
                return Instant.parse(stored.asText());
            } catch (java.time.format.DateTimeParseException ignored) {
                // not ours: the append's time below
            }
        }
        return Instant.EPOCH.plusNanos(appendedAtMicros * 1000);
    }

    // ---- streaming

    @Override
    public MessageStream<EventMessage> stream(@Nonnull StreamingCondition condition, @Nullable ProcessingContext context) {
        TrackingToken token = condition.position();
        long after = token == null || token == TrackingToken.FIRST ? 0
                : token == TrackingToken.LATEST ? head()
                : token.position().orElse(0);
        Follower follower = new Follower(query(condition.criteria()), Math.max(after, 0));
        streams.execute(follower);
        return follower.stream;
    }

    /**
     * Follows the server's live stream into a queue the consumer reads; a dropped connection is
     * taken up again after the last event delivered, with backoff, until the stream is closed.
     */
    private final class Follower implements Runnable {

        private final JsonNode query;
        private long last;
        private final AtomicReference<InputStream> body = new AtomicReference<>();
        private final Object consumed = new Object();
        final QueueMessageStream<EventMessage> stream = new QueueMessageStream<>(new java.util.concurrent.LinkedBlockingQueue<>(1024)) {
            @Override
            public void close() {
                super.close();
                closeBody();
            }
        };

        Follower(JsonNode query, long after) {
            this.query = query;
            this.last = after;
            stream.onConsumeCallback(() -> {
                synchronized (consumed) {
                    consumed.notifyAll();
                }
            });
        }

        @Override
        public void run() {
            long backoff = 100;
            while (!stream.isClosed()) {
                Map<String, String> params = new HashMap<>();
                if (!query.path("items").isEmpty()) {
                    params.put("query", query.toString());
                }
                params.put("after", Long.toString(last));
                try {
                    HttpResponse<InputStream> response = http.send(get("/v1/subscribe", params),
                                                                   HttpResponse.BodyHandlers.ofInputStream());
                    body.set(response.body());
                    if (stream.isClosed()) {
                        closeBody();
                        return;
                    }
                    check(response.statusCode(), () -> readAll(response.body()));
                    LineReader lines = new LineReader(response.body());
                    String line;
                    while ((line = lines.next()) != null) {
                        if (line.isBlank()) {
                            continue;
                        }
                        Map.Entry<EventMessage, Context> entry;
                        try {
                            entry = fromWire(parse(line));
                        } catch (RuntimeException e) {
                            // An event that cannot be read ends the stream, never passed over.
                            stream.completeExceptionally(e);
                            return;
                        }
                        long position = entry.getValue().getResource(TrackingToken.RESOURCE_KEY).position().orElse(0);
                        if (position <= last) {
                            continue;
                        }
                        if (!offer(entry)) {
                            return;
                        }
                        last = position;
                        backoff = 100;
                    }
                } catch (AnnalsException e) {
                    if (!e.retryable()) {
                        stream.completeExceptionally(e);
                        return;
                    }
                } catch (IOException | RuntimeException e) {
                    // Dropped or unreachable: taken up again below.
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return;
                } finally {
                    closeBody();
                }
                if (stream.isClosed()) {
                    return;
                }
                try {
                    Thread.sleep(backoff / 2 + (long) (Math.random() * backoff / 2));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return;
                }
                backoff = Math.min(backoff * 2, 5000);
            }
        }

        /** Waits for room in the queue; false once the stream is closed. */
        private boolean offer(Map.Entry<EventMessage, Context> entry) throws InterruptedException {
            while (!stream.offer(entry.getKey(), entry.getValue())) {
                if (stream.isClosed()) {
                    return false;
                }
                synchronized (consumed) {
                    consumed.wait(100);
                }
            }
            return true;
        }

        private void closeBody() {
            InputStream in = body.getAndSet(null);
            if (in != null) {
                try {
                    in.close();
                } catch (IOException ignored) {
                    // closed either way
                }
            }
        }
    }

    /** Reads lines of UTF-8 bytes, each whole before it is answered. */
    private static final class LineReader {
        private final InputStream in;
        private final java.io.ByteArrayOutputStream line = new java.io.ByteArrayOutputStream();
        private final byte[] buffer = new byte[64 * 1024];
        private int at;
        private int end;

        LineReader(InputStream in) {
            this.in = in;
        }

        String next() throws IOException {
            while (true) {
                while (at < end) {
                    byte b = buffer[at++];
                    if (b == '\n') {
                        String text = line.toString(StandardCharsets.UTF_8);
                        line.reset();
                        return text;
                    }
                    line.write(b);
                }
                end = in.read(buffer);
                at = 0;
                if (end < 0) {
                    throw new IOException("the stream ended");
                }
            }
        }
    }

    // ---- tokens

    @Override
    public CompletableFuture<TrackingToken> firstToken(@Nullable ProcessingContext context) {
        return CompletableFuture.completedFuture(new GlobalSequenceTrackingToken(0));
    }

    @Override
    public CompletableFuture<TrackingToken> latestToken(@Nullable ProcessingContext context) {
        return send(get("/v1/head", Map.of())).thenApply(answer -> new GlobalSequenceTrackingToken(answer.path("head").asLong()));
    }

    /**
     * The token after which the events stamped at or after {@code at} begin: the log is read
     * backwards from its head until an event stamped before {@code at} (events are taken to be
     * stamped in the order they were appended); the head's token when none is.
     */
    @Override
    public CompletableFuture<TrackingToken> tokenAt(@Nonnull Instant at, @Nullable ProcessingContext context) {
        return CompletableFuture.supplyAsync(() -> {
            long head = head();
            long first = -1;
            Long before = null;
            scan:
            while (true) {
                ObjectNode options = JSON.createObjectNode().put("backwards", true).put("limit", 256);
                if (before != null) {
                    options.put("after", before);
                }
                List<JsonNode> page = readLines(get("/v1/read", Map.of("options", options.toString())));
                if (page.isEmpty()) {
                    break;
                }
                for (JsonNode wire : page) {
                    Map.Entry<EventMessage, Context> entry = fromWire(wire);
                    if (entry.getKey().timestamp().isBefore(at)) {
                        break scan;
                    }
                    first = wire.path("position").asLong();
                }
                before = page.getLast().path("position").asLong();
            }
            return new GlobalSequenceTrackingToken(first < 0 ? head : first - 1);
        }, streams);
    }

    private long head() {
        return send(get("/v1/head", Map.of())).join().path("head").asLong();
    }

    /** Stops the engine's threads; its open streams end. */
    @Override
    public void close() {
        streams.shutdownNow();
        http.close();
    }

    @Override
    public void describeTo(@Nonnull ComponentDescriptor descriptor) {
        descriptor.describeProperty("url", url);
    }

    // ---- the wire

    /** Criteria as a DCB query: each criterion an item (types OR-ed, tags AND-ed). */
    static JsonNode query(EventCriteria criteria) {
        ObjectNode query = JSON.createObjectNode();
        ArrayNode items = query.putArray("items");
        if (!criteria.hasCriteria()) {
            return query;
        }
        for (EventCriterion criterion : criteria.flatten()) {
            ObjectNode item = items.addObject();
            ArrayNode types = item.putArray("types");
            criterion.types().forEach(type -> types.add(type.name()));
            ArrayNode tags = item.putArray("tags");
            criterion.tags().forEach(tag -> tags.add(TagCodec.encode(tag)));
        }
        return query;
    }

    private HttpRequest get(String path, Map<String, String> params) {
        StringBuilder uri = new StringBuilder(url).append(path);
        char separator = '?';
        for (Map.Entry<String, String> param : params.entrySet()) {
            uri.append(separator).append(param.getKey()).append('=')
               .append(URLEncoder.encode(param.getValue(), StandardCharsets.UTF_8));
            separator = '&';
        }
        HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(uri.toString()))
                                                 .header("accept", "application/x-ndjson");
        if (!path.equals("/v1/subscribe")) {
            request.timeout(TIMEOUT);
        }
        return authorized(request).GET().build();
    }

    private HttpRequest post(String path, JsonNode body) {
        return authorized(HttpRequest.newBuilder(URI.create(url + path)).timeout(TIMEOUT))
                .header("content-type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(body.toString()))
                .build();
    }

    private HttpRequest.Builder authorized(HttpRequest.Builder request) {
        return apiKey == null ? request : request.header("authorization", "Bearer " + apiKey);
    }

    private CompletableFuture<JsonNode> send(HttpRequest request) {
        return http.sendAsync(request, HttpResponse.BodyHandlers.ofString()).handle((response, error) -> {
            if (error != null) {
                throw new CompletionException(new AnnalsException.Unreachable(url, unwrap(error)));
            }
            check(response.statusCode(), response::body);
            return parse(response.body());
        });
    }

    private List<JsonNode> readLines(HttpRequest request) {
        HttpResponse<java.util.stream.Stream<String>> response;
        try {
            response = http.send(request, HttpResponse.BodyHandlers.ofLines());
        } catch (IOException e) {
            throw new AnnalsException.Unreachable(url, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new AnnalsException.Unreachable(url, e);
        }
        check(response.statusCode(), () -> String.join("\n", response.body().toList()));
        return response.body().filter(line -> !line.isBlank()).map(AnnalsEventStorageEngine::parse).toList();
    }

    /** Throws the server's refusal for a status that is not 2xx. */
    private static void check(int status, java.util.function.Supplier<String> body) {
        if (status / 100 == 2) {
            return;
        }
        String text = body.get();
        try {
            JsonNode answer = JSON.readTree(text);
            throw new AnnalsException(status, answer.path("kind").asText("http_" + status), answer.path("error").asText(text));
        } catch (IOException e) {
            throw new AnnalsException(status, "http_" + status, text.strip());
        }
    }

    private static JsonNode parse(String text) {
        try {
            return JSON.readTree(text);
        } catch (IOException e) {
            throw new IllegalStateException("Annals: an answer that is not JSON: " + e.getMessage(), e);
        }
    }

    private static String readAll(InputStream in) {
        try {
            return new String(in.readAllBytes(), StandardCharsets.UTF_8);
        } catch (IOException e) {
            return "";
        }
    }

    private static Throwable unwrap(Throwable error) {
        return error instanceof CompletionException && error.getCause() != null ? error.getCause() : error;
    }
}
