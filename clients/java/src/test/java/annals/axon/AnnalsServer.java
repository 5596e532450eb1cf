package annals.axon;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * A server of the Annals binary the project's test command names ({@code ANNALS_BIN}), started
 * on a free port with a store of its own: a fresh directory, or, when {@code ANNALS_PG_BASE} is
 * set (a {@code postgres://} URL ending in {@code /}), the database {@code name} there, which
 * the test command made empty.
 */
final class AnnalsServer implements AutoCloseable {

    private final Process process;
    private final Path dir;
    final String url;

    private AnnalsServer(Process process, Path dir, String url) {
        this.process = process;
        this.dir = dir;
        this.url = url;
    }

    static AnnalsServer start(String name) throws IOException, InterruptedException {
        String bin = System.getenv("ANNALS_BIN");
        if (bin == null || bin.isBlank()) {
            throw new IllegalStateException("ANNALS_BIN names no annals binary (the project's test command sets it)");
        }
        Path dir = Files.createTempDirectory("annals-axon-" + name);
        List<String> command = new ArrayList<>(List.of(bin, "serve", "--http", "127.0.0.1:0", "--grpc", "off"));
        String pg = System.getenv("ANNALS_PG_BASE");
        if (pg != null && !pg.isBlank()) {
            command.addAll(List.of("--store", pg + name));
        } else {
            command.addAll(List.of("--data-dir", dir.resolve("data").toString()));
        }
        Process process = new ProcessBuilder(command).redirectErrorStream(true).start();
        BufferedReader out = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
        CompletableFuture<String> listening = CompletableFuture.supplyAsync(() -> {
            try {
                String line;
                StringBuilder seen = new StringBuilder();
                while ((line = out.readLine()) != null) {
                    if (line.startsWith("annals: listening ")) {
                        for (String part : line.substring("annals: listening ".length()).split("\\s+")) {
                            if (part.startsWith("http=")) {
                                return "http://" + part.substring("http=".length());
                            }
                        }
                    }
                    seen.append(line).append('\n');
                }
                throw new IllegalStateException("the server ended before it listened:\n" + seen);
            } catch (IOException e) {
                throw new IllegalStateException(e);
            }
        });
        String url;
        try {
            url = listening.get(60, TimeUnit.SECONDS);
        } catch (Exception e) {
            process.destroyForcibly();
            throw new IllegalStateException("the server did not start", e);
        }
        // Its later output is drained, so that it never blocks on a full pipe.
        Thread drain = new Thread(() -> {
            try {
                while (out.readLine() != null) {
                    // dropped
                }
            } catch (IOException ignored) {
                // the server ended
            }
        });
        drain.setDaemon(true);
        drain.start();
        return new AnnalsServer(process, dir, url);
    }

    @Override
    public void close() throws Exception {
        process.destroy();
        if (!process.waitFor(20, TimeUnit.SECONDS)) {
            process.destroyForcibly();
        }
    }
}
