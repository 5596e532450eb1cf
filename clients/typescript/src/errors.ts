/** One event's fault against its type's schema (kind `schema_violation`). */
export interface Violation {
  index?: number
  type: string
  version: number
  instancePath: string
  schemaPath: string
  message: string
}

/**
 * A refusal the server answered: its HTTP status, its stable kind (`invalid_tag`,
 * `event_too_large`, `schema_violation`, `database_unavailable`, ...) and its message. Nothing
 * of a refused append was stored, unless the kind is `outcome_unknown`.
 */
export class AnnalsError extends Error {
  override readonly name = "AnnalsError"

  constructor(
    readonly status: number,
    readonly kind: string,
    message: string,
    readonly violations: Violation[] = [],
  ) {
    super(`Annals: ${message} (${status} ${kind})`)
  }

  /** Whether the request may be sent again later as it is (nothing was done). */
  get retryable(): boolean {
    return this.kind !== "outcome_unknown" && [429, 503, 507].includes(this.status)
  }

  /** Whether the append may or may not be stored: read to find out. */
  get outcomeUnknown(): boolean {
    return this.kind === "outcome_unknown"
  }
}

/**
 * The server could not be reached, or its answer was cut off. For an append the outcome is
 * not known.
 */
export class AnnalsUnreachableError extends Error {
  override readonly name = "AnnalsUnreachableError"

  constructor(
    readonly url: string,
    override readonly cause: unknown,
  ) {
    super(`Annals: ${url} could not be reached: ${cause instanceof Error ? cause.message : String(cause)}`)
  }
}
