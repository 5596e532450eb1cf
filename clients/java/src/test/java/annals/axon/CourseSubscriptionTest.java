package annals.axon;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.axonframework.eventsourcing.eventstore.AppendEventsTransactionRejectedException;
import org.axonframework.eventsourcing.eventstore.EventStore;
import org.axonframework.eventsourcing.eventstore.EventStoreTransaction;
import org.axonframework.eventsourcing.eventstore.SourcingCondition;
import org.axonframework.eventsourcing.eventstore.StorageEngineBackedEventStore;
import org.axonframework.messaging.core.EmptyApplicationContext;
import org.axonframework.messaging.core.MessageType;
import org.axonframework.messaging.core.unitofwork.SimpleUnitOfWorkFactory;
import org.axonframework.messaging.core.unitofwork.UnitOfWorkFactory;
import org.axonframework.messaging.eventhandling.EventMessage;
import org.axonframework.messaging.eventhandling.GenericEventMessage;
import org.axonframework.messaging.eventhandling.SimpleEventBus;
import org.axonframework.messaging.eventstreaming.EventCriteria;
import org.axonframework.messaging.eventstreaming.Tag;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

/**
 * The course subscription rule as an Axon Framework 5 application on Annals: a course takes at
 * most its capacity, a student at most a number of courses. The command's handler sources both
 * boundaries in one event store transaction, decides, and appends; the unit of work's commit
 * appends on the condition that nothing it sourced changed meanwhile, and a conflict is retried.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class CourseSubscriptionTest {

    private static final String SUBSCRIBED = "StudentSubscribed";

    private AnnalsServer server;
    private EventStore eventStore;
    private final UnitOfWorkFactory units = new SimpleUnitOfWorkFactory(EmptyApplicationContext.INSTANCE);

    @BeforeAll
    void start() throws Exception {
        server = AnnalsServer.start("course_subscriptions");
        // Each event is tagged with its course and its student, as its metadata names them.
        eventStore = new StorageEngineBackedEventStore(
                new AnnalsEventStorageEngine(server.url), new SimpleEventBus(),
                event -> Set.of(Tag.of("course", event.metadata().get("course")),
                                Tag.of("student", event.metadata().get("student"))));
    }

    @AfterAll
    void stop() throws Exception {
        server.close();
    }

    enum Outcome { SUBSCRIBED, COURSE_FULL, STUDENT_BUSY, ALREADY }

    private record State(int courseTaken, int studentTaken, boolean already) {
    }

    /** The command: subscribe {@code student} to {@code course}, retried when another got there first. */
    Outcome subscribe(String course, String student, int capacity, int limit) throws Exception {
        for (int attempt = 0; attempt < 20; attempt++) {
            try {
                return units.create().executeWithResult(context -> {
                    EventStoreTransaction transaction = eventStore.transaction(context);
                    EventCriteria criteria = EventCriteria.either(
                            EventCriteria.havingTags(Tag.of("course", course)).andBeingOneOfTypes(SUBSCRIBED),
                            EventCriteria.havingTags(Tag.of("student", student)).andBeingOneOfTypes(SUBSCRIBED));
                    return transaction.source(SourcingCondition.conditionFor(criteria))
                                      .reduce(new State(0, 0, false), (state, entry) -> fold(state, entry.message(), course, student))
                                      .thenApply(state -> {
                                          Outcome outcome = decide(state, capacity, limit);
                                          if (outcome == Outcome.SUBSCRIBED) {
                                              transaction.appendEvent(new GenericEventMessage(
                                                      new MessageType(SUBSCRIBED),
                                                      "{\"course\":\"" + course + "\",\"student\":\"" + student + "\"}",
                                                      Map.of("course", course, "student", student)));
                                          }
                                          return outcome;
                                      });
                }).get();
            } catch (ExecutionException e) {
                if (!(rootCause(e) instanceof AppendEventsTransactionRejectedException)) {
                    throw e;
                }
            }
        }
        throw new IllegalStateException("the decision kept conflicting");
    }

    private static State fold(State state, EventMessage event, String course, String student) {
        if (!SUBSCRIBED.equals(event.type().qualifiedName().name())) {
            return state;
        }
        boolean inCourse = course.equals(event.metadata().get("course"));
        boolean ofStudent = student.equals(event.metadata().get("student"));
        return new State(state.courseTaken + (inCourse ? 1 : 0), state.studentTaken + (ofStudent ? 1 : 0),
                         state.already || (inCourse && ofStudent));
    }

    private static Outcome decide(State state, int capacity, int limit) {
        if (state.already) {
            return Outcome.ALREADY;
        }
        if (state.courseTaken >= capacity) {
            return Outcome.COURSE_FULL;
        }
        if (state.studentTaken >= limit) {
            return Outcome.STUDENT_BUSY;
        }
        return Outcome.SUBSCRIBED;
    }

    private static Throwable rootCause(Throwable e) {
        while ((e instanceof ExecutionException || e instanceof CompletionException) && e.getCause() != null) {
            e = e.getCause();
        }
        return e;
    }

    private static String unique(String prefix) {
        return prefix + "-" + UUID.randomUUID();
    }

    @Test
    void theLastSeatGoesToExactlyOneOfTheStudentsRacingForIt() throws Exception {
        String course = unique("course");
        assertThat(subscribe(course, unique("early"), 3, 5)).isEqualTo(Outcome.SUBSCRIBED);
        assertThat(subscribe(course, unique("early"), 3, 5)).isEqualTo(Outcome.SUBSCRIBED);
        ExecutorService racers = Executors.newFixedThreadPool(8);
        try {
            List<Future<Outcome>> outcomes = new ArrayList<>();
            for (int i = 0; i < 8; i++) {
                String student = unique("racer");
                outcomes.add(racers.submit(() -> subscribe(course, student, 3, 5)));
            }
            int won = 0;
            int full = 0;
            for (Future<Outcome> outcome : outcomes) {
                switch (outcome.get()) {
                    case SUBSCRIBED -> won++;
                    case COURSE_FULL -> full++;
                    default -> throw new AssertionError("unexpected: " + outcome.get());
                }
            }
            assertThat(won).isEqualTo(1);
            assertThat(full).isEqualTo(7);
        } finally {
            racers.shutdownNow();
        }
    }

    @Test
    void aStudentsLimitHoldsAcrossCourses() throws Exception {
        String student = unique("student");
        assertThat(subscribe(unique("course"), student, 10, 2)).isEqualTo(Outcome.SUBSCRIBED);
        String second = unique("course");
        assertThat(subscribe(second, student, 10, 2)).isEqualTo(Outcome.SUBSCRIBED);
        assertThat(subscribe(unique("course"), student, 10, 2)).isEqualTo(Outcome.STUDENT_BUSY);
        assertThat(subscribe(second, student, 10, 2)).isEqualTo(Outcome.ALREADY);
    }

    @Test
    void badInputGetsTheEnginesTypedErrors() throws Exception {
        AnnalsEventStorageEngine engine = new AnnalsEventStorageEngine(server.url);
        // A tag over the server's limit: refused whole, nothing stored.
        GenericEventMessage event = new GenericEventMessage(new MessageType(SUBSCRIBED), "{}");
        var tagged = new org.axonframework.eventsourcing.eventstore.GenericTaggedEventMessage<>(
                event, Set.of(Tag.of("course", "x".repeat(300))));
        CompletableFuture<?> appended = engine.appendEvents(
                org.axonframework.eventsourcing.eventstore.AppendCondition.none(), null, List.of(tagged))
                                              .thenCompose(tx -> tx.commit(null));
        assertThatThrownBy(appended::get).hasRootCauseInstanceOf(AnnalsException.class)
                                         .rootCause().satisfies(e -> assertThat(((AnnalsException) e).kind()).isEqualTo("invalid_tag"));
        // An event over the server's size limit.
        GenericEventMessage big = new GenericEventMessage(new MessageType(SUBSCRIBED), "x".repeat(2 << 20));
        var bigTagged = new org.axonframework.eventsourcing.eventstore.GenericTaggedEventMessage<>(big, Set.of());
        CompletableFuture<?> tooBig = engine.appendEvents(
                org.axonframework.eventsourcing.eventstore.AppendCondition.none(), null, List.of(bigTagged))
                                            .thenCompose(tx -> tx.commit(null));
        assertThatThrownBy(tooBig::get).hasRootCauseInstanceOf(AnnalsException.class);
        // A server that is down.
        java.net.ServerSocket socket = new java.net.ServerSocket(0);
        int port = socket.getLocalPort();
        socket.close();
        AnnalsEventStorageEngine down = new AnnalsEventStorageEngine("http://127.0.0.1:" + port);
        assertThatThrownBy(() -> down.latestToken(null).get()).cause().isInstanceOf(AnnalsException.Unreachable.class)
                                                             .cause().isInstanceOf(java.net.ConnectException.class);
        assertThatThrownBy(() -> new AnnalsEventStorageEngine("ftp://x")).isInstanceOf(IllegalArgumentException.class);
    }
}
