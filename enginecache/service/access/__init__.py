"""Who may reach and do what: roles, the audit log, the address the dashboard listens on, and the
`serve` process that starts it."""
