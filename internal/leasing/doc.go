// Package leasing is the consumer contract of the lease system (docs/design.md): acquire
// with waiting, check-at-use, payload update and idempotent release, on top of the store
// (internal/leasestore) and the merged definitions (internal/definition).
//
// Acquire resolves the lease definition; a reference "none" or "" and a definition without
// caps give a NOOP lease without any store traffic. Otherwise it makes one attempt at the
// funnel; while a level is full it sweeps idle holders of that resource (the lazy sweep,
// handing the reaped holders to the RevocationListener asynchronously) and waits until
// min(waitMs, the request's waitMs, the context's deadline) in the process's wait queue
// (internal/waitq), oldest first: a slot freed in this process or, through the notifier, in
// another one wakes it; a jittered safety timer makes it look itself about once a second
// (Store.Probe, a read; the write path only when every level shows room). See
// docs/waiting.md. Outcomes are a Lease or a typed error: *lease.BusyError
// (lease.ErrBusy), *lease.UnavailableError (lease.ErrUnavailable, fail closed), *lease.InvalidError (lease.ErrInvalid,
// naming the field); Check reports lease.ErrLost.
//
// Metrics are those of docs/design.md (internal/metrics). Tenant and user IDs never become
// label values: inline resources are labelled "mcp-inline", and the number of distinct
// resource labels is bounded.
package leasing
