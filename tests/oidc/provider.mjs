// A real OpenID Connect provider for the login tests (tests/oidckit.py starts it; tests/test_login_e2e.py
// logs in through it): panva's certified `oidc-provider`, on 127.0.0.1 only, everything in memory.
//
//   node provider.mjs --port 0 --redirect-uri http://localhost:8501/oauth2callback [--client-secret S]
//
// --port 0 (the default) listens on a free port chosen by the kernel, so there is no race for it;
// the issuer is http://127.0.0.1:<port>. One line `READY <issuer>` on stdout once it listens.
//
// One confidential client, `enginecache` (authorization code flow, client_secret_basic, which is what
// Authlib, behind Streamlit's st.login, uses), and four accounts whose ID token carries `email` and
// `name`. Logging in is oidc-provider's own development interaction: a form taking a login (the
// account's e-mail) and any password, then a consent page. Test use only: never expose it.

import http from 'node:http';
import { parseArgs } from 'node:util';

import Provider, { interactionPolicy } from 'oidc-provider';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string', default: '0' },
    'redirect-uri': { type: 'string', multiple: true, default: [] },
    'client-id': { type: 'string', default: 'enginecache' },
    'client-secret': { type: 'string', default: 'enginecache-test-secret' },
  },
});
if (args['redirect-uri'].length === 0) {
  console.error('provider.mjs: give at least one --redirect-uri');
  process.exit(2);
}

const ACCOUNTS = new Map(
  [
    ['viewer@example.com', 'Vera Viewer'],
    ['operator@example.com', 'Otto Operator'],
    ['admin@example.com', 'Ada Admin'],
    ['nobody@example.com', 'Nora Nobody'],
  ].map(([email, name]) => [email, { email, email_verified: true, name }]),
);

// Streamlit asks for `prompt=select_account` unless told otherwise; oidc-provider refuses a prompt
// value its policy does not name, so the policy names it with no checks: accepted, never an
// extra interaction (there is one account per login anyway).
const policy = interactionPolicy.base();
const selectAccount = new interactionPolicy.Prompt({ name: 'select_account', requestable: true });
selectAccount.checks.splice(0, selectAccount.checks.length);
policy.add(selectAccount, 0);

const server = http.createServer();
server.listen(Number(args.port), '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  const provider = new Provider(issuer, {
    clients: [
      {
        client_id: args['client-id'],
        client_secret: args['client-secret'],
        redirect_uris: args['redirect-uri'],
        // Streamlit's st.logout ends the provider's session too, returning to its redirect URI.
        post_logout_redirect_uris: args['redirect-uri'],
        response_types: ['code'],
        grant_types: ['authorization_code'],
        token_endpoint_auth_method: 'client_secret_basic',
      },
    ],
    scopes: ['openid', 'email', 'profile'],
    claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'] },
    // The ID token itself carries the scopes' claims (Streamlit's st.user is read from it).
    conformIdTokenClaims: false,
    findAccount: (_ctx, id) => {
      const account = ACCOUNTS.get(id);
      if (!account) return undefined;
      return { accountId: id, claims: () => ({ sub: id, ...account }) };
    },
    interactions: { policy },
    cookies: { keys: ['enginecache-test-cookie-key'] },
    responseTypes: ['code'],
    features: { devInteractions: { enabled: true } },
    pkce: { required: () => false },
  });
  // Unknown logins fail the token's findAccount: say so in the provider's log rather than silently.
  provider.on('server_error', (_ctx, err) => console.error('provider server_error:', err));
  server.on('request', provider.callback());
  console.log(`READY ${issuer}`);
});

const stop = () => server.close(() => process.exit(0));
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
