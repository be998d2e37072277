// outside the region: a span's attribute, not a procedure
const attributes = { 'queuebox.source': 'x' };

export function fromMssql(pool) {
  const take = () => pool.request().input('source', 'x').execute('queuebox.take');
  // line 7: a procedure the schema lacks
  const give = () => pool.request().execute('queuebox.' +
    'give');
  return { take, give, text: `queuebox.take` };
}

const after = 'queuebox.after';
