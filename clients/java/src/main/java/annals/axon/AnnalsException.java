package annals.axon;

/**
 * A refusal the Annals server answered: its HTTP status, its stable kind ({@code invalid_tag},
 * {@code event_too_large}, {@code database_unavailable}, ...) and its message. Nothing of a
 * refused append was stored, unless the kind is {@code outcome_unknown}.
 */
public class AnnalsException extends RuntimeException {

    private final int status;
    private final String kind;

    public AnnalsException(int status, String kind, String message) {
        super("Annals: " + message + " (" + status + " " + kind + ")");
        this.status = status;
        this.kind = kind;
    }

    public int status() {
        return status;
    }

    public String kind() {
        return kind;
    }

    /** Whether nothing was done and the request may be sent again later as it is. */
    public boolean retryable() {
        return !"outcome_unknown".equals(kind) && (status == 429 || status == 503 || status == 507);
    }

    /** Whether the append may or may not be stored: read to find out. */
    public boolean outcomeUnknown() {
        return "outcome_unknown".equals(kind);
    }

    /** The server could not be reached, or its answer was cut off. */
    public static class Unreachable extends RuntimeException {
        public Unreachable(String url, Throwable cause) {
            super("Annals: " + url + " could not be reached: "
                          + (cause.getMessage() != null ? cause.getMessage() : cause.getClass().getSimpleName()), cause);
        }
    }
}
