package annals.axon;

import org.axonframework.eventsourcing.eventstore.StorageEngineTestSuite;
import org.axonframework.messaging.core.unitofwork.ProcessingContext;
import org.junit.jupiter.api.AfterAll;

/**
 * Axon Framework 5's own conformance suite for storage engines, unchanged, run against an
 * Annals server with a store of its own (the suite needs an empty store that only it writes).
 */
class AnnalsStorageEngineTest extends StorageEngineTestSuite<AnnalsEventStorageEngine> {

    private AnnalsServer server;
    private AnnalsEventStorageEngine engine;

    @Override
    protected AnnalsEventStorageEngine buildStorageEngine() throws Exception {
        server = AnnalsServer.start("storage_engine_suite");
        engine = new AnnalsEventStorageEngine(server.url);
        return engine;
    }

    @Override
    protected ProcessingContext processingContext() {
        return null;
    }

    @AfterAll
    void stopServer() throws Exception {
        if (engine != null) {
            engine.close();
        }
        if (server != null) {
            server.close();
        }
    }
}
